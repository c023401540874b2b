"""Prometheus collector for jobs: counts by state and GPUs held. No per-tenant job detail."""

import redis
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.choices import JobState
from jobs.models import Allocation, Job, Notification
from jobs.services.lifecycle import IGNORED_REPORTS_KEY
from jobs.services import launch_failures, leadership
from jobs.services.scheduling_loop import BACKOFF_KEY, STAGES, STATS_KEY
from jobs.services.notifications import ERRORS_KEY as NOTIFICATION_ERRORS_KEY
from monitoring.models import Gpu
from monitoring.services.gpu_totals import DEVICE_FIELDS, count_devices
from monitoring.services.redis_client import get_redis, number, numbers


class JobsCollector(Collector):
    def collect(self):
        jobs = GaugeMetricFamily("colony_jobs", "Jobs by state", labels=["state"])
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        # GPUs, not allocations: jobs packed onto one GPU hold it once, and so do jobs on MIG
        # instances of one GPU (colony_gpus counts it once too).
        held = count_devices(Gpu.objects.filter(pk__in=Allocation.objects.filter(released_at__isnull=True)
                                                .values("gpu_id")).order_by().values_list(*DEVICE_FIELDS))
        yield GaugeMetricFamily("colony_gpus_allocated", "GPUs held by at least one job", value=held.gpus)
        yield GaugeMetricFamily("colony_mig_instances_allocated", "MIG instances held by a job",
                                value=held.mig_instances)
        notifications = GaugeMetricFamily("colony_notifications", "Notifications by delivery state", labels=["state"])
        sent = dict(Notification.objects.values_list("state").annotate(n=Count("id")))
        for state in Notification.State.values:
            notifications.add_metric([state], sent.get(state, 0))
        yield notifications
        yield from _leader_series()
        try:
            ignored, unrecorded = (number(v or 0) or 0.0
                                   for v in get_redis().mget(IGNORED_REPORTS_KEY, NOTIFICATION_ERRORS_KEY))
        except redis.RedisError:
            return
        yield CounterMetricFamily("colony_lifecycle_ignored_reports", "Node reports about an attempt that is not "
                                  "a job's current one (fenced off, changed nothing)", value=ignored)
        yield CounterMetricFamily("colony_notification_errors", "Job events whose notifications could not be "
                                  "recorded or queued (logged; the job's change went ahead)", value=unrecorded)
        try:
            scheduler = list(_scheduler_series())
            flagged = numbers(get_redis(), launch_failures.FLAGGED_KEY)
        except redis.RedisError:
            return
        yield from scheduler
        failures = CounterMetricFamily("colony_node_launch_failures", "Launches that failed on the node for a "
                                       "reason of its own (the job was tried on another node)", labels=["node"])
        for node, count in sorted(flagged.items()):
            failures.add_metric([node], count)
        yield failures


def _scheduler_series():
    """The scheduling loop: counters for rates, the last cycle's time (a stalled loop stops moving
    it) and whether it is backing off from a database outage."""
    client = get_redis()
    stats = numbers(client, STATS_KEY)
    yield CounterMetricFamily("colony_scheduler_cycles", "Scheduling cycles run", value=stats.get("cycles", 0.0))
    yield CounterMetricFamily("colony_scheduler_cycle_seconds", "Seconds spent in scheduling cycles",
                              value=stats.get("cycle_seconds", 0.0))
    yield CounterMetricFamily("colony_scheduler_placements", "Jobs placed by the scheduler",
                              value=stats.get("placed", 0.0))
    yield CounterMetricFamily("colony_scheduler_lease_takeovers", "Scheduler leases taken from a holder that "
                              "stopped mid-cycle without handing them back (failovers)",
                              value=stats.get("takeovers", 0.0))
    yield CounterMetricFamily("colony_scheduler_fenced_cycles", "Cycles whose decisions were refused because "
                              "another scheduler had taken the lease over (logged with their jobs)",
                              value=stats.get("fenced", 0.0))
    yield CounterMetricFamily("colony_scheduler_snapshot_divergences", "Periodic checks in which the snapshot built "
                              "from what the loader kept between cycles differed from one built afresh (a bug; "
                              "logged with the parts that differed)", value=stats.get("snapshot_divergences", 0.0))
    stages = CounterMetricFamily("colony_scheduler_stage_seconds", "Seconds spent in each stage of the scheduling "
                                 "cycles (usage, snapshot, decide, apply, resend): where a slow loop's time goes",
                                 labels=["stage"])
    for stage in STAGES:
        stages.add_metric([stage], stats.get(f"stage_seconds:{stage}", 0.0))
    yield stages
    if "last_cycle_at" in stats:
        yield GaugeMetricFamily("colony_scheduler_last_cycle_timestamp_seconds", "When the last cycle ended",
                                value=stats["last_cycle_at"])
        if "last_cycle_seconds" in stats:
            yield GaugeMetricFamily("colony_scheduler_last_cycle_seconds", "How long the last cycle took",
                                    value=stats["last_cycle_seconds"])
        last_stages = GaugeMetricFamily("colony_scheduler_last_cycle_stage_seconds",
                                        "How long each stage of the last cycle took", labels=["stage"])
        for stage in STAGES:
            if f"last_stage_seconds:{stage}" in stats:
                last_stages.add_metric([stage], stats[f"last_stage_seconds:{stage}"])
        yield last_stages
    yield GaugeMetricFamily("colony_scheduler_backed_off", "1 while the loop pauses for a database outage",
                            value=float(bool(client.exists(BACKOFF_KEY))))


def _leader_series():
    """The scheduler lease of record (jobs/services/leadership.py): its epoch only grows, by one per
    change of holder; the holder label names the process (host:pid:token) that last ran a cycle."""
    lease = leadership.current()
    if lease is None:
        return
    yield GaugeMetricFamily("colony_scheduler_leader_epoch", "Epoch of the scheduler lease (grows when it "
                            "changes hands)", value=lease["epoch"])
    leader = GaugeMetricFamily("colony_scheduler_leader", "1 while the named scheduler process holds the lease "
                               "(inside a cycle), 0 once it handed it back or let it expire", labels=["holder"])
    leader.add_metric([lease["holder"]], float(lease["held"]))
    yield leader
