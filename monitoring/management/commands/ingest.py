"""``manage.py ingest``: a metrics-stream reader. Run several for more throughput."""

import logging
import signal
import threading

from django.core.management.base import BaseCommand

from monitoring.services.ingest import DEFAULT_HOLD_S, Ingestor
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Read node samples from the metrics stream into live values and rollups until SIGTERM."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=2000)
        parser.add_argument("--block-ms", type=int, default=1000, help="how long one read waits for entries")
        parser.add_argument("--hold-s", type=float, default=DEFAULT_HOLD_S,
                            help="longest an open 10 s rollup bucket is held in memory before it is written "
                                 "(0: write every bucket with every batch); a killed reader loses at most this much")

    def handle(self, *args, batch_size: int, block_ms: int, hold_s: float, **options):
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        ingestor = Ingestor(get_redis(), batch_size=batch_size, hold_s=hold_s)
        log.info("ingest reader %s started", ingestor.consumer)
        ingestor.run_forever(stop, block_ms=block_ms)
        log.info("ingest reader %s stopped", ingestor.consumer)
