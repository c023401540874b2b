"""Shared by the notification tests: a real local webhook receiver and Celery run in-process."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class WebhookReceiver:
    """A real HTTP server on 127.0.0.1 that records every POST and answers the next queued status
    (200 once the queue is empty)."""

    def __init__(self):
        self.received: list[dict] = []
        self.hosts: list[str] = []  # the Host header of each POST
        self.statuses: list[int] = []
        self.headers: dict[int, dict] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append(json.loads(body))
                receiver.hosts.append(self.headers.get("Host", ""))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                for name, value in receiver.headers.get(status, {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"nope")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hooks/T000/B000"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(settings):
    settings.COLONY_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def eager_celery():
    """Tasks run in the caller, retries included (without their countdown)."""
    from cluster_ui.celery import app

    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield app
    app.conf.task_always_eager = previous
