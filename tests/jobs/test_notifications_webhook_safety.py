"""A webhook URL is the user's, the network is Colony's: no URL may make the server call its own
services (Redis, the database, a cloud's metadata endpoint), neither when saved nor when sent."""

from __future__ import annotations

import socket

import pytest

from jobs.services import notifications
from jobs.services.notifications import HostNotFound, WebhookRefused, check_webhook_url
from tests.jobs.notification_helpers import webhook  # noqa: F401 (fixture)

INTERNAL = [
    "http://127.0.0.1:6379/",
    "http://localhost:8000/admin/",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.5.5/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/hook",  # carrier-grade NAT, not the internet either
    "http://0.0.0.0/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[fd00::1]/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number
]


@pytest.fixture(autouse=True)
def nothing_allowed(settings):
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = []


@pytest.mark.parametrize("url", INTERNAL)
def test_internal_addresses_are_refused(url):
    with pytest.raises(WebhookRefused, match="internal address"):
        check_webhook_url(url)


@pytest.mark.parametrize("url, why", [
    ("file:///etc/passwd", "http:// or https://"),
    ("gopher://example.org/", "http:// or https://"),
    ("https://", "no host"),
    ("https://user:secret@93.184.215.14/hook", "no user name or password"),
    ("http://[not-an-address/", "not a valid URL"),
])
def test_only_plain_http_urls(url, why):
    with pytest.raises(WebhookRefused, match=why):
        check_webhook_url(url)


def test_public_address_is_accepted():
    target = check_webhook_url("https://93.184.215.14/services/T0/B0?x=1")
    assert (target.address, target.port, target.path) == ("93.184.215.14", 443, "/services/T0/B0?x=1")


def test_an_operator_may_allow_an_internal_host(settings):
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    assert check_webhook_url("http://127.0.0.1:9000/hook").address == "127.0.0.1"
    with pytest.raises(WebhookRefused):
        check_webhook_url("http://10.0.0.1/hook")  # only the host named


def test_unknown_host_is_refused_with_its_name(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", fake_dns({}))  # no resolver wait on a machine without DNS
    with pytest.raises(HostNotFound, match="nonexistent.invalid"):
        check_webhook_url("https://nonexistent.invalid/hook")


def test_a_name_that_points_inside_is_refused(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", fake_dns({"hooks.example.test": "10.0.0.7"}))
    with pytest.raises(WebhookRefused, match=r"hooks.example.test is an internal address \(10.0.0.7\)"):
        check_webhook_url("https://hooks.example.test/hook")


def test_the_post_goes_to_the_address_that_was_checked(webhook, monkeypatch, settings):
    """DNS rebinding: the name is resolved once, checked, and that very address is connected to."""
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = ["chat.example.test"]
    answers = iter(["127.0.0.1", "10.9.9.9"])  # a second lookup of the name would get another answer
    real_getaddrinfo = socket.getaddrinfo

    def rebinding_dns(host, port, *args, **kwargs):
        if host != "chat.example.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_dns)
    port = webhook.server.server_port
    message = notifications.Message(title="job 1 x succeeded", url="http://colony/jobs/1/", details=[], output="")

    notifications.send_webhook(f"http://chat.example.test:{port}/hook", message)

    assert webhook.hosts == [f"chat.example.test:{port}"]


def test_a_name_repointed_inside_after_saving_is_refused_when_sending(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", fake_dns({"hooks.example.test": "93.184.215.14"}))
    check_webhook_url("https://hooks.example.test/hook")  # fine when saved
    monkeypatch.setattr(socket, "getaddrinfo", fake_dns({"hooks.example.test": "169.254.169.254"}))
    message = notifications.Message(title="job 1 x failed", url="http://colony/jobs/1/", details=[], output="")
    with pytest.raises(notifications.Refused, match="internal address"):
        notifications.send_webhook("https://hooks.example.test/hook", message)


def fake_dns(names: dict[str, str]):
    def getaddrinfo(host, port, *args, **kwargs):
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (names[host], port))]

    return getaddrinfo
