"""The notebook proxy end to end but for the browser and Jupyter: a real proxy (asyncio, h11) and a
real node relay (:class:`agents.tunnel.TunnelRelay`) on the private Redis, in front of a stand-in
notebook server on loopback that answers only to its token. A ticket buys a cookie for that job's
path; with it requests and WebSockets go through, carrying the server's token and never the
user's cookie; without it, with a forged or expired one, one of another job, or from a page of
another site, nothing reaches the server."""

from __future__ import annotations

import asyncio
import http.client
import http.server
import socket
import threading
import time

import pytest
import redis.asyncio
from django.core import signing as django_signing

from agents import tunnel_protocol
from agents.tunnel import TunnelRelay
from jobs.choices import JobState
from jobs.models import Allocation
from jobs.notebook_proxy.server import Proxy
from jobs.services import notebook_tokens, notebooks
from tests.factories import GpuFactory, JobFactory, NodeFactory

KEY = b"n" * 32


class Notebook(http.server.BaseHTTPRequestHandler):
    """Answers its token only; an Upgrade gets a 101 and then an echo of every byte."""

    token = ""
    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.path, {name.lower(): value for name, value in self.headers.items()}))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"token {self.token}":
            self._answer(403, b"token required")
        elif self.headers.get("Upgrade") == "websocket":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while data := self.rfile.read1(4096):
                self.wfile.write(data.upper())
                self.wfile.flush()
        elif self.path.endswith("/set-cookies"):
            own = self.path.rsplit("/", 1)[0] + "/"
            self._answer(200, b"cookies", [f"_xsrf=ok; Path={own}", "sessionid=tossed; Path=/",
                                           f"csrftoken=tossed; Path={own}", "other=1; Path=/notebooks/999/",
                                           f"wide=1; Domain=colony.test; Path={own}", "nopath=1"])
        else:
            self._answer(200, f"hello {self.path}".encode())

    do_POST = do_GET

    def _answer(self, status, body, cookies=()):
        self.send_response(status)
        for cookie in cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def notebook(db, vision, alice):
    job = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice, env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "600"})
    Allocation.objects.create(job=job, gpu=GpuFactory(node=NodeFactory(name="n1"), index=0))
    return job


@pytest.fixture
def stack(notebook, redis_url, tmp_path):
    """(proxy port, relay, requests the notebook server saw)."""
    Notebook.token, Notebook.seen = notebook_tokens.token(f"launch-{notebook.pk}-0"), []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Notebook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "notebook.port").write_text(f"{server.server_address[1]}\n")
    relay = TunnelRelay("n1", redis_url, KEY, lambda job_id: tmp_path)
    relay.track({notebook.pk: f"launch-{notebook.pk}-0"})
    relay.start()
    loop, ready = asyncio.new_event_loop(), threading.Event()
    port = []

    async def serve():
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=30)
        proxy = Proxy(client, lambda node: KEY, dashboard_url="http://colony.test")
        listening = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        port.append(listening.sockets[0].getsockname()[1])
        ready.set()

    def run():
        loop.create_task(serve())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield port[0], relay, Notebook.seen
    async def stop():
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        loop.stop()

    asyncio.run_coroutine_threadsafe(stop(), loop)
    thread.join(5)
    relay.close()
    server.shutdown()


def get(port: int, path: str, method: str = "GET", **headers) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, headers=headers)
    response = connection.getresponse()
    response.body = response.read()
    return response


def enter(port: int, alice, job) -> str:
    """The cookie header a browser holds after following the job page's link."""
    ticket = notebooks.ticket_for(alice, job)
    answer = get(port, f"/notebooks/{job.pk}/lab?{notebooks.TICKET_PARAM}={ticket}&x=1")
    assert answer.status == 303 and answer.getheader("Location") == f"/notebooks/{job.pk}/lab?x=1"
    cookie = answer.getheader("Set-Cookie")
    assert f"Path=/notebooks/{job.pk}/" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    return cookie.split(";", 1)[0]


def test_a_ticket_buys_a_cookie_and_requests_reach_the_server_with_its_token(stack, alice, notebook):
    port, _relay, seen = stack
    cookie = enter(port, alice, notebook)
    answer = get(port, f"/notebooks/{notebook.pk}/lab?x=1", Cookie=f"_xsrf=2|a1|b2=|17; {cookie}",
                 Authorization="Bearer the-users-own")
    assert answer.status == 200 and answer.body == f"hello /notebooks/{notebook.pk}/lab?x=1".encode()
    [(_path, headers)] = seen
    assert headers["authorization"] == f"token {Notebook.token}"  # the server's, never the browser's
    assert headers["cookie"] == "_xsrf=2|a1|b2=|17"  # Jupyter's own cookies pass; Colony's stays with Colony
    # Keep-alive: a second request on one connection, and a body.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for number in range(2):
        connection.request("POST", f"/notebooks/{notebook.pk}/api/{number}", body=b"x" * 100_000,
                           headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"})
        response = connection.getresponse()
        assert response.status == 200 and response.read().endswith(f"/api/{number}".encode())


def test_without_a_valid_cookie_nothing_reaches_the_server(stack, alice, notebook, vision, monkeypatch):
    port, relay, seen = stack
    other = JobFactory(state=JobState.RUNNING, tenant=vision, owner=alice,
                       env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "600"})
    Allocation.objects.create(job=other, gpu=GpuFactory(node=notebook.allocations.get().gpu.node, index=1))
    cookie = enter(port, alice, notebook)
    other_cookie = f"{notebooks.cookie_name(notebook.pk)}={cookie.split('=', 1)[1]}"
    forged = django_signing.dumps({"u": alice.pk, "j": notebook.pk, "n": "n1", "l": f"launch-{notebook.pk}-0"},
                                  key="guessed", salt="colony.notebook.cookie")
    stale = notebooks.ticket_for(alice, notebook)
    for path, headers in [
        (f"/notebooks/{notebook.pk}/lab", {}),
        (f"/notebooks/{notebook.pk}/lab", {"Cookie": f"{notebooks.cookie_name(notebook.pk)}={forged}"}),
        (f"/notebooks/{other.pk}/lab", {"Cookie": other_cookie}),  # this job's cookie, another job's path
        (f"/notebooks/{other.pk}/lab?{notebooks.TICKET_PARAM}={stale}", {}),  # this job's ticket, there
    ]:
        answer = get(port, path, **headers)
        assert answer.status == 403 and b"Open the notebook from" in answer.body, (path, answer.body)
    later = time.time() + notebooks.TICKET_S + 1
    monkeypatch.setattr(django_signing.time, "time", lambda: later)
    answer = get(port, f"/notebooks/{notebook.pk}/lab?{notebooks.TICKET_PARAM}={stale}")
    assert answer.status == 403 and b"expired" in answer.body
    assert get(port, "/elsewhere").status == 404
    assert seen == [] and relay.open_connections == 0


def test_another_sites_page_may_not_post_or_open_a_websocket(stack, alice, notebook):
    port, _relay, seen = stack
    cookie = enter(port, alice, notebook)
    answer = get(port, f"/notebooks/{notebook.pk}/api/contents", "POST", Cookie=cookie, Origin="http://evil.test")
    assert answer.status == 403
    answer = get(port, f"/notebooks/{notebook.pk}/api/kernels/1/channels", Cookie=cookie, Origin="http://evil.test",
                 Connection="Upgrade", Upgrade="websocket")
    assert answer.status == 403 and seen == []


def test_a_websocket_goes_through_both_ways(stack, alice, notebook):
    port, _relay, _seen = stack
    cookie = enter(port, alice, notebook)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET /notebooks/{notebook.pk}/api/kernels/1/channels HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Origin: http://127.0.0.1:{port}\r\nCookie: {cookie}\r\nConnection: Upgrade\r\n"
                     "Upgrade: websocket\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        rest = head.split(b"\r\n\r\n", 1)[1]
        sock.sendall(b"ping-42")
        while b"PING-42" not in rest:
            rest += sock.recv(4096)


def test_when_the_session_ends_the_browser_is_told(stack, alice, notebook):
    port, relay, _seen = stack
    cookie = enter(port, alice, notebook)
    relay.track({})
    answer = get(port, f"/notebooks/{notebook.pk}/lab", Cookie=cookie)
    assert answer.status == 503 and b"not running any more" in answer.body


def test_the_dashboards_cookies_never_reach_the_notebook_and_it_may_set_cookies_for_its_own_path_only(
        stack, alice, notebook):
    """Browsers scope cookies by host, not port: the dashboard's session reaches the proxy. The
    notebook server is the job's own code, so it must not see that session, nor toss cookies
    into the dashboard's jar or another job's notebook."""
    port, _relay, seen = stack
    cookie = enter(port, alice, notebook)
    answer = get(port, f"/notebooks/{notebook.pk}/lab",
                 Cookie=f"sessionid=the-users-session; csrftoken=c; _xsrf=x; colony_nb_999=y; {cookie}")
    assert answer.status == 200
    assert seen[-1][1]["cookie"] == "_xsrf=x"
    answer = get(port, f"/notebooks/{notebook.pk}/set-cookies", Cookie=cookie)
    assert answer.status == 200
    assert answer.headers.get_all("Set-Cookie") == [f"_xsrf=ok; Path=/notebooks/{notebook.pk}/"]
