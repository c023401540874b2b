"""Past jobs as a replayable trace (``manage.py export_trace``), so an operator can replay last
week under proposed quotas before applying them (``simulate --trace FILE --quota-file Q``).

A job that ran becomes a ``TraceJob``: submitted at its submit time, running as long as its last
run took, with its recorded peak memory and mean utilisation (when the agents measured them, else
its request and a whole GPU's compute). Jobs that never started (cancelled while pending) are
left out: they asked for nothing the cluster gave. Nodes and quotas are today's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime

from jobs.choices import TERMINAL_STATES
from jobs.models import Job, Tenant
from jobs.scheduling.simulate.trace import NodeSpec, Trace, TraceJob
from jobs.scheduling.snapshot import TenantQuota
from jobs.services.snapshot_loader import intra_node_bandwidth
from monitoring.models import Gpu, JobUsage, Node


def export_trace(since: datetime, until: datetime, name: str = "colony") -> Trace:
    jobs = list(
        Job.objects.filter(submitted_at__gte=since, submitted_at__lt=until, state__in=TERMINAL_STATES,
                           started_at__isnull=False, finished_at__isnull=False)
        .select_related("tenant").order_by("submitted_at", "id")
    )
    usage = {u.job_id: u for u in JobUsage.objects.filter(job_id__in=[job.id for job in jobs])}
    start = jobs[0].submitted_at if jobs else since
    trace_jobs = []
    for job in jobs:
        used = usage.get(job.id)
        peak = (used.peak_gpu_memory_mib or None) if used else None
        mean = used.mean_util if used else None
        trace_jobs.append(TraceJob(
            id=job.id, tenant=job.tenant.slug, submit_s=(job.submitted_at - start).total_seconds(),
            duration_s=max(1.0, (job.finished_at - job.started_at).total_seconds()), gpus=job.gpus,
            gpu_milli=job.gpu_milli, gpu_models=frozenset(job.gpu_models or ()),
            memory_mib=peak or job.peak_gpu_memory_mib or job.gpu_memory_mib,
            utilisation=round(mean / 100.0, 3) if mean is not None else job.gpu_milli / 1000,
            opportunistic_only=job.opportunistic_only, priority=job.priority,
        ))
    return Trace(name, tuple(trace_jobs), _nodes(), _quotas())


def _nodes() -> tuple[NodeSpec, ...]:
    gpus = defaultdict(list)
    for gpu in Gpu.objects.filter(present=True):
        gpus[gpu.node_id].append(gpu)
    specs = []
    for node in Node.objects.order_by("name"):
        mine = gpus.get(node.id)
        if not mine:
            continue
        model = Counter(g.model for g in mine).most_common(1)[0][0]
        specs.append(NodeSpec(node.name, len(mine), model, min(g.memory_mib for g in mine), rack=node.rack,
                              intra_node_gb_per_s=intra_node_bandwidth(node.topology)))
    return tuple(specs)


def _quotas() -> tuple[TenantQuota, ...]:
    return tuple(TenantQuota(t.slug, t.guaranteed_gpus, t.max_gpus, t.weight) for t in Tenant.objects.order_by("slug"))
