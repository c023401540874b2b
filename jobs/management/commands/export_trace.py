"""Write the jobs of a past window as a Colony JSON trace for ``simulate`` to replay."""

from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.scheduling.simulate.trace import write_colony_trace
from jobs.services.trace_export import export_trace


class Command(BaseCommand):
    help = "Export finished jobs (default: the last 7 days) with today's nodes and quotas as a replayable trace."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=7.0, help="how far back from now (default 7)")
        parser.add_argument("--since", help="ISO start instead of --days, e.g. 2026-11-16T00:00:00Z")
        parser.add_argument("--until", help="ISO end (default now)")
        parser.add_argument("--out", required=True, help="file to write (JSON)")

    def handle(self, *args, days: float, since: str | None, until: str | None, out: str, **options):
        end = _when(until, "--until") if until else timezone.now()
        start = _when(since, "--since") if since else end - timedelta(days=days)
        if start >= end:
            raise CommandError("the window is empty: --since must be before --until")
        trace = export_trace(start, end)
        write_colony_trace(trace, out)
        self.stdout.write(f"wrote {len(trace.jobs)} jobs, {len(trace.nodes)} nodes, "
                          f"{len(trace.quotas)} tenants to {out}")


def _when(text: str, flag: str) -> datetime:
    value = parse_datetime(text)
    if value is None:
        raise CommandError(f"{flag}: not an ISO date-time: {text!r}")
    return value if timezone.is_aware(value) else timezone.make_aware(value)
