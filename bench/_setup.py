"""Shared set-up for benchmarks that need Django: a private Redis and a throw-away database, and
the CPU clock of other processes (the PostgreSQL backend, Redis) that benches print beside wall time.

PostgreSQL (a database named by the bench, recreated; ``colony_bench`` by default) when one
answers on 127.0.0.1:5432, else a SQLite file under a temporary directory. Benches that may run
side by side name their own database. Nothing touches the development database.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _postgres_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), 1).close()
        return True
    except OSError:
        return False


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0 when it cannot be read."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_pid() -> int | None:
    """The PostgreSQL backend serving this process's default connection (None elsewhere), whose
    CPU ``proc_cpu`` reads."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def setup(database: str = "auto", name: str = "colony_bench") -> tuple[str, "PrivateRedis"]:  # noqa: F821
    """Start Redis, point Django at a fresh bench database ``name``, migrate; returns (db label, redis)."""
    from cluster_ui.devstack.redis_server import PrivateRedis

    workdir = Path(tempfile.mkdtemp(prefix="colony-bench-"))
    redis = PrivateRedis(workdir / "redis").start()
    use_pg = database == "postgres" or (database == "auto" and _postgres_answers())
    if use_pg:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    os.environ["REDIS_URL"] = redis.url
    os.environ["COLONY_VAR_DIR"] = str(workdir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")
    # Production settings refuse to start without a key when DEBUG is off: a throw-away one, in a
    # file of the bench's own directory (a path, not the key, in the environment its children get).
    if not (os.environ.get("DJANGO_SECRET_KEY") or os.environ.get("DJANGO_SECRET_KEY_FILE")):
        key = workdir / "django-secret-key"
        key.write_text(secrets.token_urlsafe(50))
        key.chmod(0o600)
        os.environ["DJANGO_SECRET_KEY_FILE"] = str(key)
    os.environ.setdefault("COLONY_LOG_LEVEL", "WARNING")
    # The benchmarks' test client speaks plain http (production defaults to HTTPS redirects).
    os.environ.setdefault("COLONY_HTTPS", "0")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return ("PostgreSQL" if use_pg else "SQLite"), redis
