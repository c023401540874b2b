"""``manage.py agent_key NODE [NODE ...]``: the signing key to install on each node's agent.

The key is derived from ``COLONY_AGENT_SECRET`` (nothing is stored); the same node always gets the
same key, and changing the secret changes every key. Install it on the node as a file only the
agent's account can read, and start the agent with ``--key-file PATH``.

    python manage.py agent_key gpu-01                      # prints the key (64 hex digits)
    python manage.py agent_key gpu-01 gpu-02 --write-dir /etc/colony/keys   # gpu-01.key, gpu-02.key, mode 600
"""

import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agents import protocol, signing


class Command(BaseCommand):
    help = "Print (or write, with --write-dir) each node's agent signing key, derived from COLONY_AGENT_SECRET."

    def add_arguments(self, parser):
        parser.add_argument("nodes", nargs="+", metavar="node", help="a node's name, as its agent's --node")
        parser.add_argument("--write-dir", type=Path, metavar="DIR",
                            help="write DIR/NODE.key (mode 600) for each node instead of printing the keys")

    def handle(self, *args, nodes: list[str], write_dir: Path | None, **options):
        secret = _secret()
        keys = {node: signing.node_key(secret, _node(node)).hex() for node in nodes}
        if write_dir is None:
            if len(keys) == 1:
                self.stdout.write(next(iter(keys.values())))
            else:
                self.stdout.write("\n".join(f"{node} {key}" for node, key in keys.items()))
            return
        write_dir.mkdir(parents=True, exist_ok=True)
        for node, key in keys.items():
            _write_private(write_dir / f"{node}.key", key + "\n")
            self.stdout.write(f"wrote {write_dir / f'{node}.key'}")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, never briefly wider."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file of the same name keeps its mode otherwise
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _secret() -> str:
    secret = settings.COLONY_AGENT_SECRET
    if len(secret) < signing.MIN_SECRET_LENGTH:
        raise CommandError(f"set COLONY_AGENT_SECRET (or COLONY_AGENT_SECRET_FILE), at least "
                           f"{signing.MIN_SECRET_LENGTH} characters, to issue agent credentials")
    return secret


def _node(node: str) -> str:
    if not protocol.NODE_NAME_RE.match(node):
        raise CommandError(f"invalid node name {node!r}: 1-63 letters, digits, '.', '_' or '-'")
    return node
