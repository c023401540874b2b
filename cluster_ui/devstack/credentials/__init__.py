"""Credentials for the compose stack, written once into one directory (volume) per consumer.

``python -m cluster_ui.devstack.credentials --nodes node-1 node-2`` (the compose ``credentials``
service, run as root before anything else) creates, unless they already exist:

- ``/run/colony/server/``: ``agent-secret``, ``django-secret-key``, ``redis-url`` (the control
  plane's, with its password), ``cache-url``, ``database-url``: for web, worker, beat, ingest;
- ``/run/colony/redis/``: ``redis.conf`` (``requirepass``, one ACL user per node, from
  :func:`agents.signing.redis_acl_rules`, and the size limits of
  :data:`cluster_ui.devstack.redis_server.LIMITS`: no value over 1 MiB) and ``password`` (for the
  health check);
- ``/run/colony/postgres/password``;
- ``/run/colony/<node>/``: ``node.key`` and ``redis-url`` (the node's own ACL user): for that
  node's agent only.

Every file is mode 600 and owned by the account that reads it, every directory 700; no service
gets a secret in its environment (``*_FILE`` and ``--key-file``/``--redis-file`` name the files).
Standard library plus :mod:`agents.signing`; no Django.
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
from pathlib import Path
from urllib.parse import quote

from agents import signing
from cluster_ui.devstack.redis_server import LIMITS

# uid/gid of the official redis and postgres images' server accounts.
REDIS_UID = POSTGRES_UID = 999


def _write(path: Path, text: str, owner: tuple[int, int] | None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (text + "\n").encode())
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _dir(path: Path, owner: tuple[int, int] | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if owner is not None:
        os.chown(path, *owner)
    return path


def _kept(path: Path, make) -> str:
    """The secret already in ``path`` (kept across restarts), else a new one."""
    return path.read_text().strip() if path.exists() and path.read_text().strip() else make()


def write_credentials(root: Path, nodes: list[str], *, redis_host: str = "redis", postgres_host: str = "postgres",
                      colony_account: str | None = "colony", chown: bool = True) -> None:
    colony = None
    if chown:
        entry = pwd.getpwnam(colony_account) if colony_account else None
        colony = (entry.pw_uid, entry.pw_gid) if entry else None
    redis_owner = (REDIS_UID, REDIS_UID) if chown else None
    postgres_owner = (POSTGRES_UID, POSTGRES_UID) if chown else None
    server, redis_dir, postgres = (_dir(root / "server", colony), _dir(root / "redis", redis_owner),
                                   _dir(root / "postgres", postgres_owner))
    agent_secret = _kept(server / "agent-secret", lambda: secrets.token_hex(32))
    django_key = _kept(server / "django-secret-key", lambda: secrets.token_urlsafe(50))
    redis_password = _kept(redis_dir / "password", lambda: secrets.token_hex(24))
    postgres_password = _kept(postgres / "password", lambda: secrets.token_hex(24))
    _write(server / "agent-secret", agent_secret, colony)
    _write(server / "django-secret-key", django_key, colony)
    _write(server / "redis-url", f"redis://:{redis_password}@{redis_host}:6379/0", colony)
    _write(server / "cache-url", f"redis://:{redis_password}@{redis_host}:6379/1", colony)
    _write(server / "database-url", f"postgres://colony:{postgres_password}@{postgres_host}:5432/colony", colony)
    _write(postgres / "password", postgres_password, postgres_owner)
    users = []
    for node in nodes:
        password = signing.redis_password(agent_secret, node)
        users.append(f"user {signing.redis_user(node)} {' '.join(signing.redis_acl_rules(node, password))}")
        node_dir = _dir(root / node, colony)
        _write(node_dir / "node.key", signing.node_key(agent_secret, node).hex(), colony)
        _write(node_dir / "redis-url",
               f"redis://{quote(signing.redis_user(node), safe='')}:{password}@{redis_host}:6379/0", colony)
    _write(redis_dir / "password", redis_password, redis_owner)
    _write(redis_dir / "redis.conf", "\n".join(['save ""', "appendonly no", *LIMITS,
                                                f"requirepass {redis_password}", *users]), redis_owner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster_ui.devstack.credentials",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/run/colony"))
    parser.add_argument("--nodes", nargs="+", required=True)
    parser.add_argument("--no-chown", action="store_true", help="leave owners as they are (tests)")
    args = parser.parse_args(argv)
    write_credentials(args.root, args.nodes, chown=not args.no_chown)
    print(f"credentials for {', '.join(args.nodes)} in {args.root} (mode 600)")
    return 0
