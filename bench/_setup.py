"""Shared set-up for benchmarks that need Django: a private Redis and a throw-away database, and
the CPU clock of other processes (the PostgreSQL backend, Redis) that benches print beside wall time.

PostgreSQL when one answers on 127.0.0.1:5432, else a SQLite file under a temporary directory.
The PostgreSQL database is ``$COLONY_BENCH_DB`` when set, else the bench's own name suffixed with
this process's id (``colony_bench_loop_12345``): two runs on one server never drop each other's.
It is created for the run and dropped when the bench exits (``COLONY_BENCH_KEEP_DB=1`` keeps it
for a look afterwards). Nothing touches the development database.
"""

from __future__ import annotations

import atexit
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


def database_name(bench: str) -> str:
    """The PostgreSQL database this run of ``bench`` uses: ``$COLONY_BENCH_DB``, else one of its
    own (``bench`` suffixed with the process id)."""
    return os.environ.get("COLONY_BENCH_DB") or f"{bench}_{os.getpid()}"


def _drop_at_exit(url: str, name: str) -> None:
    owner = os.getpid()

    def drop() -> None:
        if os.getpid() != owner or os.environ.get("COLONY_BENCH_KEEP_DB") == "1":
            return  # (a forked child exiting, or kept on purpose)
        import psycopg
        from psycopg import sql

        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django never set up, or already gone: FORCE below ends its sessions anyway
            pass
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        except psycopg.Error as exc:
            print(f"  (bench database {name} not dropped: {exc})", file=sys.stderr)

    atexit.register(drop)


def setup(database: str = "auto", name: str = "colony_bench", redis_cache: bool = False
          ) -> tuple[str, "PrivateRedis"]:  # noqa: F821
    """Start Redis, point Django at a fresh bench database (:func:`database_name` of ``name``,
    dropped at exit), migrate; returns (db label, redis). ``redis_cache``: Django's cache in that
    Redis too (production's ``COLONY_CACHE_URL``), not the per-process memory it defaults to."""
    from cluster_ui.devstack.redis_server import PrivateRedis

    workdir = Path(tempfile.mkdtemp(prefix="colony-bench-"))
    redis = PrivateRedis(workdir / "redis").start()
    use_pg = database == "postgres" or (database == "auto" and _postgres_answers())
    if use_pg:
        import psycopg
        from psycopg import sql

        name = database_name(name)
        server = "postgresql://postgres@127.0.0.1:5432/postgres"
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        _drop_at_exit(server, name)
        os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{name}"
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    os.environ["REDIS_URL"] = redis.url
    if redis_cache:
        os.environ.pop("COLONY_CACHE_URL_FILE", None)
        os.environ["COLONY_CACHE_URL"] = redis.url.rsplit("/", 1)[0] + "/1"
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
