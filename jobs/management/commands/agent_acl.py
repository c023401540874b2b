"""``manage.py agent_acl NODE``: print the Redis ACL user for node NODE's agent.

The user may append to the streams agents write (events, metrics, dead letters, write-only), and
read, ack and heartbeat only on its own keys (``colony:node:NODE:*``): it cannot read another
node's commands, nor anything other nodes sent. Its password is derived from
``COLONY_AGENT_SECRET`` (nothing is stored); the ACL line holds only the password's SHA-256.

    python manage.py agent_acl gpu-01 | redis-cli -u "$REDIS_ADMIN_URL"     # apply it
    python manage.py agent_acl gpu-01 --url     # the agent's Redis URL, with user and password
"""

from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings
from django.core.management.base import BaseCommand

from agents import signing
from jobs.management.commands.agent_key import _node, _secret


class Command(BaseCommand):
    help = "Print the Redis ACL SETUSER line (or, with --url, the agent's Redis URL) for node NODE's agent."

    def add_arguments(self, parser):
        parser.add_argument("node", help="the node's name, as its agent's --node")
        parser.add_argument("--url", action="store_true",
                            help="print the agent's Redis URL (REDIS_URL's host with the node's user and "
                                 "password) instead, for the node's COLONY_REDIS_URL")

    def handle(self, *args, node: str, url: bool, **options):
        node, secret = _node(node), _secret()
        password = signing.redis_password(secret, node)
        if url:
            self.stdout.write(agent_redis_url(settings.REDIS_URL, signing.redis_user(node), password))
        else:
            self.stdout.write(signing.redis_acl_setuser(node, password))


def agent_redis_url(server_url: str, user: str, password: str) -> str:
    parts = urlsplit(server_url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))
