"""Prometheus collector for jobs: counts by state and GPUs held. No per-tenant job detail."""

import redis
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.choices import JobState
from jobs.models import Allocation, Job, Notification
from jobs.services.lifecycle import IGNORED_REPORTS_KEY
from jobs.services.notifications import ERRORS_KEY as NOTIFICATION_ERRORS_KEY
from monitoring.services.redis_client import get_redis


class JobsCollector(Collector):
    def collect(self):
        jobs = GaugeMetricFamily("colony_jobs", "Jobs by state", labels=["state"])
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        # GPUs, not allocations: jobs packed onto one GPU hold it once.
        yield GaugeMetricFamily("colony_gpus_allocated", "GPUs held by at least one job",
                                value=Allocation.objects.filter(released_at__isnull=True)
                                .values("gpu_id").distinct().count())
        notifications = GaugeMetricFamily("colony_notifications", "Notifications by delivery state", labels=["state"])
        sent = dict(Notification.objects.values_list("state").annotate(n=Count("id")))
        for state in Notification.State.values:
            notifications.add_metric([state], sent.get(state, 0))
        yield notifications
        try:
            ignored, unrecorded = (float(v or 0) for v in get_redis().mget(IGNORED_REPORTS_KEY, NOTIFICATION_ERRORS_KEY))
        except redis.RedisError:
            return
        yield CounterMetricFamily("colony_lifecycle_ignored_reports", "Node reports about an attempt that is not "
                                  "a job's current one (fenced off, changed nothing)", value=ignored)
        yield CounterMetricFamily("colony_notification_errors", "Job events whose notifications could not be "
                                  "recorded or queued (logged; the job's change went ahead)", value=unrecorded)
