"""Prometheus collector for jobs: counts by state and GPUs held. No per-tenant job detail."""

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.choices import JobState
from jobs.models import Allocation, Job


class JobsCollector(Collector):
    def collect(self):
        jobs = GaugeMetricFamily("colony_jobs", "Jobs by state", labels=["state"])
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield GaugeMetricFamily("colony_gpus_allocated", "GPUs held by jobs",
                                value=Allocation.objects.filter(released_at__isnull=True).count())
