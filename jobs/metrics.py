"""Prometheus collector for jobs: counts by state and GPUs held. No per-tenant job detail."""

import redis
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.choices import JobState
from jobs.models import Allocation, Job
from jobs.services.lifecycle import IGNORED_REPORTS_KEY
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
        try:
            ignored = float(get_redis().get(IGNORED_REPORTS_KEY) or 0)
        except redis.RedisError:
            return
        yield CounterMetricFamily("colony_lifecycle_ignored_reports", "Node reports about an attempt that is not "
                                  "a job's current one (fenced off, changed nothing)", value=ignored)
