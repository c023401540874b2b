"""Operators hear about cluster alerts: one message when an alert opens, however often it is seen
again, and one when it is resolved, by email (Django's outbox) and by webhook (a real HTTP server on
127.0.0.1), retried when the webhook fails. Researchers can neither subscribe nor receive: an alert
names nodes and other tenants' jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from agents import protocol
from jobs.models import NotificationSettings
from jobs.services import alerts as job_alerts
from jobs.services import notifications
from monitoring.choices import AlertKind, NodeHealth
from monitoring.models import Alert, Gpu
from monitoring.services import alerts
from agents.streams import dead_letter
from monitoring.services.redis_client import get_redis
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.jobs.notification_helpers import eager_celery, webhook  # noqa: F401 (fixtures)

API_URL = "/api/v1/me/notifications/"
PAGE_URL = "/jobs/notifications/"


@pytest.fixture
def operator(db):
    return UserFactory(username="operator", email="ops@example.org", is_staff=True)


@pytest.fixture
def researcher(db):
    return MembershipFactory(user=UserFactory(username="alice", email="alice@example.org"),
                             tenant=TenantFactory(slug="vision")).user


@pytest.fixture
def telling(live_redis, eager_celery, django_capture_on_commit_callbacks):
    """Runs ``fn`` as the alert code does (in a transaction), then what it left for after commit."""
    def run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            with transaction.atomic():
                return fn(*args, **kwargs)

    return run


def subscribe(user, events=("alert:xid",), email=True, webhook_url=""):
    return NotificationSettings.objects.create(user=user, email=email, webhook_url=webhook_url, events=list(events))


def xid(node, index=0):
    return alerts.raise_alert(AlertKind.XID, node_id=node.pk, gpu_id=Gpu.objects.get(node=node, index=index).pk,
                              message=f"XID 79 on {node.name}/gpu{index}", details={"xid": [79]})


def test_operator_gets_one_message_per_opened_alert_on_each_channel(operator, node_n1, webhook, telling, settings):
    settings.COLONY_PUBLIC_URL = "https://colony.example.org"
    subscribe(operator, webhook_url=webhook.url)

    alert = telling(xid, node_n1)
    for _ in range(3):  # seen again on every sample: still the one open alert
        assert telling(xid, node_n1).pk == alert.pk

    [message] = mail.outbox
    assert message.to == ["ops@example.org"]
    assert message.subject == "Colony: alert: XID 79 on n1/gpu0"
    assert f"https://colony.example.org/admin/monitoring/alert/{alert.pk}/change/" in message.body
    assert "Node: n1" in message.body and "GPU: n1/gpu0" in message.body
    [payload] = webhook.received
    assert payload["text"].startswith("Colony: alert: XID 79 on n1/gpu0")


def test_resolving_sends_one_resolved_message(operator, node_n1, webhook, telling):
    subscribe(operator, events=["alert:thermal"], webhook_url=webhook.url)
    gpu = Gpu.objects.get(node=node_n1, index=1)
    alert = telling(alerts.raise_alert, AlertKind.THERMAL, node_id=node_n1.pk, gpu_id=gpu.pk,
                    message="n1/gpu1 at 91 °C (threshold 85 °C)")

    assert telling(alerts.resolve, AlertKind.THERMAL, pk=alert.pk) == 1
    assert telling(alerts.resolve, AlertKind.THERMAL, pk=alert.pk) == 0  # resolved already: nothing more

    assert [m.subject for m in mail.outbox] == ["Colony: alert: n1/gpu1 at 91 °C (threshold 85 °C)",
                                                "Colony: resolved: n1/gpu1 at 91 °C (threshold 85 °C)"]
    assert "Resolved: " in mail.outbox[1].body
    assert [p["text"].split(" http")[0] for p in webhook.received] == [
        "Colony: alert: n1/gpu1 at 91 °C (threshold 85 °C)", "Colony: resolved: n1/gpu1 at 91 °C (threshold 85 °C)"]


def test_only_the_kinds_subscribed_to_are_sent(operator, node_n1, telling):
    subscribe(operator, events=["alert:node_lost"])

    telling(xid, node_n1)
    assert mail.outbox == []

    telling(alerts.node_lost, node_n1)
    assert [m.subject for m in mail.outbox] == ["Colony: alert: Node n1 stopped heartbeating"]


def test_webhook_500_is_retried_then_delivered(operator, node_n1, webhook, telling):
    subscribe(operator, email=False, webhook_url=webhook.url)
    webhook.statuses = [500, 503]

    telling(xid, node_n1)

    assert len(webhook.received) == 3
    [key] = get_redis().keys("colony:alert-notify:*")
    assert get_redis().get(key) == b"sent"


def test_webhook_that_keeps_failing_is_given_up_after_five_tries(operator, node_n1, webhook, telling):
    subscribe(operator, email=False, webhook_url=webhook.url)
    webhook.statuses = [500] * 10

    telling(xid, node_n1)
    telling(job_alerts.announce_recent)  # given up stays given up: not queued again

    assert len(webhook.received) == notifications.MAX_TRIES == 5
    [key] = get_redis().keys("colony:alert-notify:*")
    assert get_redis().get(key) == b"failed"


def test_raising_an_alert_never_fails_for_its_messages(operator, node_n1, telling, monkeypatch):
    subscribe(operator)

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker down")

    from jobs import tasks

    monkeypatch.setattr(tasks.announce_alerts, "apply_async", broker_down)
    alert = telling(xid, node_n1)
    assert Alert.objects.filter(pk=alert.pk, resolved_at__isnull=True).exists()
    assert mail.outbox == []

    monkeypatch.undo()
    telling(job_alerts.announce_recent)  # the beat's sweep catches up
    assert len(mail.outbox) == 1


def test_sweep_tells_what_the_signal_did_not_and_nothing_twice(operator, node_n1, live_redis, eager_celery):
    """Alerts raised where no message was queued after commit (another process), and resolved in
    the admin (a bulk update): the beat's sweep tells of both, once."""
    subscribe(operator)
    alert = xid(node_n1)  # in the test's transaction: its on-commit announcement never runs
    Alert.objects.filter(pk=alert.pk).update(resolved_at=timezone.now())

    assert job_alerts.announce_recent() == 2
    assert job_alerts.announce_recent() == 0
    assert sorted(m.subject.split(":")[1] for m in mail.outbox) == [" alert", " resolved"]


def test_evaluation_resolves_a_lost_node_that_is_back(operator, node_n1, telling, monkeypatch):
    subscribe(operator, events=["alert:node_lost"])
    monkeypatch.setattr(job_alerts, "resolve_cooled", lambda *a: 0)  # no live GPU readings here
    telling(alerts.node_lost, node_n1)
    node_n1.state = NodeHealth.LOST
    node_n1.save(update_fields=["state"])

    telling(job_alerts.evaluate)
    assert len(mail.outbox) == 1  # still lost

    node_n1.state = NodeHealth.UP
    node_n1.save(update_fields=["state"])
    telling(job_alerts.evaluate)

    assert Alert.objects.get().resolved_at is not None
    assert get_redis().get(notifications.ERRORS_KEY) is None  # its dead-letter watch and sweep ran cleanly
    assert [m.subject for m in mail.outbox] == ["Colony: alert: Node n1 stopped heartbeating",
                                                "Colony: resolved: Node n1 stopped heartbeating"]


def test_dead_letters_open_once_and_resolve_after_a_quiet_spell(operator, telling, redis_client):
    subscribe(operator, events=[notifications.DEAD_LETTERS])
    dead_letter(redis_client, protocol.EVENTS_STREAM, "1-0", None, "old news")
    now = timezone.now()

    assert job_alerts.watch_dead_letters(redis_client, now) is None  # the first look sets the baseline
    dead_letter(redis_client, protocol.EVENTS_STREAM, "2-0", None, "node n9 is not registered")
    assert telling(job_alerts.watch_dead_letters, redis_client, now + timedelta(seconds=30)) == "opened"
    dead_letter(redis_client, protocol.EVENTS_STREAM, "3-0", None, "node n9 is not registered")
    assert telling(job_alerts.watch_dead_letters, redis_client, now + timedelta(minutes=1)) is None
    assert telling(job_alerts.watch_dead_letters, redis_client, now + timedelta(minutes=5)) is None
    assert telling(job_alerts.watch_dead_letters, redis_client, now + timedelta(minutes=12)) == "resolved"

    opened, resolved = mail.outbox
    assert opened.subject == "Colony: alert: messages are being dead-lettered"
    assert "node n9 is not registered" in opened.body and "since this began: 1 " in opened.body
    assert resolved.subject == "Colony: resolved: no message dead-lettered for 10 min"
    assert "since this began: 2 " in resolved.body


# ---------------------------------------------------------------- tenancy


def test_researcher_cannot_subscribe_over_the_api(researcher, operator):
    client = APIClient()
    client.force_authenticate(researcher)
    response = client.patch(API_URL, {"events": ["failed", "alert:xid"]}, format="json")
    assert response.status_code == 400
    refusal = str(response.json()["error"]["fields"]["events"])
    assert "Only operators can subscribe to cluster alerts (alert:xid)" in refusal
    assert not NotificationSettings.objects.filter(user=researcher).exists()

    client.force_authenticate(operator)
    response = client.patch(API_URL, {"events": ["alert:xid", "failed", "alert:dead_letters"]}, format="json")
    assert response.status_code == 200
    assert response.json()["events"] == ["failed", "alert:xid", "alert:dead_letters"]


def test_researcher_cannot_subscribe_on_the_page(client, researcher):
    client.force_login(researcher)
    page = client.get(PAGE_URL).content.decode()
    assert "operator-alerts" not in page and "alert:xid" not in page

    response = client.post(PAGE_URL, {"email": "on", "events": ["failed", "alert:xid"], "long_wait_minutes": "60",
                                      "alerts": ["alert:xid"], "action": "save"})
    assert response.status_code == 200
    assert "alert:xid is not one of the available choices" in response.content.decode()
    assert not NotificationSettings.objects.filter(user=researcher).exists()


def test_operator_subscribes_on_the_page(client, operator):
    client.force_login(operator)
    assert 'id="operator-alerts"' in client.get(PAGE_URL).content.decode()

    client.post(PAGE_URL, {"email": "on", "events": ["failed"], "alerts": ["alert:node_lost", "alert:xid"],
                           "long_wait_minutes": "60", "action": "save"})
    assert NotificationSettings.objects.get(user=operator).events == ["failed", "alert:xid", "alert:node_lost"]

    page = client.get(PAGE_URL).content.decode()
    assert 'value="alert:xid" id="id_alerts_1" checked' in page
    assert 'value="alert:idle_gpu" id="id_alerts_0">' in page  # not chosen, not checked


def test_non_operators_never_receive_alerts(operator, researcher, node_n1, webhook, telling, monkeypatch):
    """Subscriptions written before the rules (or kept by a demoted operator) send nothing, and an
    operator demoted between the alert and the send is told nothing either."""
    subscribe(researcher, events=["alert:xid"], webhook_url=webhook.url)
    subscribe(operator, events=["alert:xid"])
    operator.is_staff = False
    operator.save(update_fields=["is_staff"])

    telling(xid, node_n1)
    assert mail.outbox == [] and webhook.received == []

    operator.is_staff = True
    operator.save(update_fields=["is_staff"])
    from jobs import tasks

    queued = []
    with monkeypatch.context() as patch:
        patch.setattr(tasks.send_alert_notification, "apply_async", lambda args, **kw: queued.append(args))
        telling(xid, node_n1, index=1)
    [(key, user_id, channel, event, message)] = queued
    operator.is_staff = False
    operator.save(update_fields=["is_staff"])

    assert job_alerts.deliver(key, user_id, channel, event, message, last_try=False) == "failed"
    assert mail.outbox == []
