"""``manage.py notebook_proxy``: serve ``/notebooks/<job>/`` (``colony jupyter``'s notebooks) to
browsers, through the nodes' tunnels. One asyncio process; run one (or several behind a balancer:
it keeps no state but each connection's)."""

from __future__ import annotations

import asyncio

from django.conf import settings
from django.core.management.base import BaseCommand

from jobs.notebook_proxy.server import serve


class Command(BaseCommand):
    help = "Serve the notebooks of colony jupyter jobs under /notebooks/<job>/."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=settings.COLONY_NOTEBOOK_PORT,
                            help=f"port (default COLONY_NOTEBOOK_PORT, {settings.COLONY_NOTEBOOK_PORT})")

    def handle(self, *args, host: str, port: int, **options):
        def ready(address):
            self.stdout.write(f"Notebook proxy on http://{address[0]}:{address[1]}/notebooks/<job>/")
            self.stdout.flush()

        try:
            asyncio.run(serve(host, port, ready=ready))
        except KeyboardInterrupt:
            pass
