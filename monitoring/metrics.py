"""Prometheus collectors for the cluster, read at scrape time from the database and Redis, and
the web server's own series: HTTP requests (django-prometheus's middleware) and its processes.

Nothing here touches ``jobs`` (its collector is ``jobs.metrics``); ``/metrics`` itself is
``cluster_ui.views.prometheus_metrics``, which puts both together.
"""

from __future__ import annotations

import os
import re

from django.db.models import Count
from prometheus_client import REGISTRY, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from agents import protocol
from monitoring.choices import AlertKind, NodeHealth
from monitoring.models import Alert, Gpu, Node
from monitoring.services import fanin, ingest, live
from agents.streams import dead_letter_count
from monitoring.services.gpu_totals import present_totals
from monitoring.services.redis_client import get_redis, numbers

GPU_GAUGES = [
    # (metric, help, field in the live entry)
    ("colony_gpu_utilization_percent", "SM utilisation of the GPU", "util_sm"),
    ("colony_gpu_memory_used_mib", "GPU memory in use", "mem_used_mib"),
    ("colony_gpu_memory_total_mib", "GPU memory capacity", "mem_total_mib"),
    ("colony_gpu_temperature_celsius", "GPU temperature", "temperature_c"),
    ("colony_gpu_power_watts", "GPU power draw", "power_w"),
]


class ClusterCollector(Collector):
    def collect(self):
        client = get_redis()
        nodes = GaugeMetricFamily("colony_nodes", "Nodes by state", labels=["state"])
        counts = dict(Node.objects.values_list("state").annotate(n=Count("id")))
        for state in NodeHealth.values:
            nodes.add_metric([state], counts.get(state, 0))
        yield nodes

        # 1 per fence each node's jobs have, 0 per one they lack; nothing for a node whose agent
        # does not report them (older than the report): an alert on == 0 must not fire on ignorance.
        fenced = GaugeMetricFamily("colony_node_fenced", "Whether every job on the node has the fence "
                                   "(cgroup, devices, accounts), as its agent registered it", labels=["node", "fence"])
        for name, fences in Node.objects.filter(job_fences__isnull=False).values_list("name", "job_fences"):
            for fence in protocol.JOB_FENCES:
                fenced.add_metric([name, fence], 1 if fence in fences else 0)
        yield fenced

        # Physical GPUs: a board split into MIG instances is one GPU, its instances a series of their own.
        totals = present_totals()
        gpus = GaugeMetricFamily("colony_gpus", "Physical GPUs present (a MIG-split GPU once), by model",
                                 labels=["model"])
        for model, n in totals.by_model:
            gpus.add_metric([model], n)
        yield gpus
        yield GaugeMetricFamily("colony_mig_gpus", "Physical GPUs present that are split into MIG instances",
                                value=totals.mig_gpus)
        instances = GaugeMetricFamily("colony_mig_instances", "MIG instances present, by GPU model and profile",
                                      labels=["model", "profile"])
        for model, profile, n in totals.mig_by_profile:
            instances.add_metric([model, profile], n)
        yield instances

        models = dict(((n, i), m) for n, i, m in Gpu.objects.filter(present=True)
                      .values_list("node__name", "index", "model"))
        families = {name: GaugeMetricFamily(name, help_, labels=["node", "gpu", "model"])
                    for name, help_, _ in GPU_GAUGES}
        for field_name, reading in sorted(live.latest_gpus(client).items()):
            node, index = field_name.rsplit(":", 1)
            labels = [node, index, models.get((node, int(index)), "unknown")]
            for name, _, key in GPU_GAUGES:
                if reading.get(key) is not None:
                    families[name].add_metric(labels, reading[key])
        yield from families.values()

        stats = ingest.ingest_stats(client)
        yield GaugeMetricFamily("colony_ingest_lag_seconds", "Median sample-to-rollup lag of the last batch",
                                value=stats.get("lag_p50", 0.0))
        yield GaugeMetricFamily("colony_ingest_lag_max_seconds", "Longest sample-to-rollup lag of the last batch",
                                value=stats.get("lag_max", 0.0))
        # The lags above freeze at their last value when ingest stops; the age of the last batch
        # is what tells a stalled reader from a quick one.
        if "committed_at" in stats:
            yield GaugeMetricFamily("colony_ingest_last_batch_timestamp_seconds",
                                    "Unix time the last ingested batch was committed", value=stats["committed_at"])
        newest = GaugeMetricFamily("colony_node_last_sample_timestamp_seconds",
                                   "Unix time of the newest sample ingested from each node", labels=["node"])
        for node, ts in sorted(numbers(client, ingest.LAST_TS_KEY).items()):
            newest.add_metric([node], ts)
        yield newest
        yield CounterMetricFamily("colony_ingest_samples", "Node samples ingested", value=stats.get("samples", 0.0))
        yield CounterMetricFamily("colony_ingest_foreign_usage", "Per-job readings a node sent for a job not placed "
                                  "on it (dropped)", value=stats.get("foreign_usage", 0.0))
        yield CounterMetricFamily("colony_dead_letters", "Stream entries rejected as malformed",
                                  value=dead_letter_count(client))
        fanned = numbers(client, fanin.STATS_KEY)
        moved = CounterMetricFamily("colony_fanin_entries", "Entries of the nodes' own streams fanned in, by "
                                    "outcome (copied, rejected as malformed, dropped from a flooded backlog)",
                                    labels=["stream", "outcome"])
        for kind in ("events", "metrics"):
            for outcome in ("copied", "rejected", "dropped"):
                moved.add_metric([kind, outcome], fanned.get(f"{kind}_{outcome}", 0.0))
        yield moved
        resets = CounterMetricFamily("colony_fanin_cursor_resets", "Node stream cursors found past everything on "
                                     "their stream (deleted and made again, ids ahead of the clock) and reset",
                                     labels=["stream"])
        for kind in fanin.SHARED:
            resets.add_metric([kind], fanned.get(f"{kind}_cursor_resets", 0.0))
        yield resets
        pending = 0
        try:
            pending = client.xpending(protocol.METRICS_STREAM, ingest.GROUP)["pending"]
        except Exception:  # no group yet: nothing is pending
            pass
        yield GaugeMetricFamily("colony_ingest_pending_entries", "Metric entries read but not yet acknowledged",
                                value=pending)
        yield GaugeMetricFamily("colony_metrics_stream_length", "Entries in the metrics stream",
                                value=client.xlen(protocol.METRICS_STREAM))

        alerts = GaugeMetricFamily("colony_alerts_open", "Open alerts by kind", labels=["kind"])
        # Every kind, zeros included: an alert rule or panel on a kind never raised yet reads 0, not "no data".
        open_counts = dict(Alert.objects.filter(resolved_at__isnull=True).values_list("kind").annotate(n=Count("id")))
        for kind in AlertKind.values:
            alerts.add_metric([kind], open_counts.get(kind, 0))
        yield alerts


# prometheus_client's multiprocess files are named <type>[_<mode>]_<pid>.db (counter_123.db,
# histogram_123.db, gauge_all_123.db).
_WRITER_PID = re.compile(r"_(\d+)\.db$")


class WorkerProcessCollector(Collector):
    """``process_*`` (CPU seconds, resident memory, open and maximum fds, start time) of every live
    process that writes to the multiprocess directory, each labelled with its ``pid``.

    Under gunicorn each worker records its requests there; prometheus_client's
    :class:`MultiProcessCollector` sums the counters but leaves process series out (they cannot be
    summed), and the default :class:`ProcessCollector` would describe only the worker that happened
    to serve this scrape. Its own ``/proc`` reader is run here for each worker instead. Workers that
    died keep their counter files (their requests still count) but get no process series.
    """

    def __init__(self, directory: str, proc: str = "/proc"):
        self.directory, self.proc = directory, proc

    def pids(self) -> list[int]:
        found = {os.getpid()}
        for name in os.listdir(self.directory):
            if match := _WRITER_PID.search(name):
                found.add(int(match.group(1)))
        return sorted(pid for pid in found if os.path.exists(os.path.join(self.proc, str(pid))))

    def collect(self):
        merged: dict[str, Metric] = {}
        for pid in self.pids():
            reader = ProcessCollector(pid=lambda pid=pid: pid, proc=self.proc, registry=None)
            for family in reader.collect():
                into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
                for sample in family.samples:
                    into.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from merged.values()


def web_process_collectors() -> list[Collector]:
    """What ``/metrics`` adds to the cluster's series about the web server that answers it.

    With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn: cluster_ui/gunicorn_conf.py sets it up before
    the workers fork), every worker's HTTP counters and histograms summed, whichever worker serves the scrape,
    and each live worker's process series. Without it (``runserver``, the devstack, tests: one
    process), that process's default registry: its HTTP series, ``process_*`` and ``python_*``.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        # A registry is a collector too: registering the default one exports everything in it.
        return [REGISTRY]
    return [MultiProcessCollector(registry=None, path=directory), WorkerProcessCollector(directory)]
