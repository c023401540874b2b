"""Build the scheduler core's ClusterSnapshot from the database and Redis."""

from __future__ import annotations

from collections import defaultdict

from jobs.choices import JobState
from jobs.models import Allocation, Job, Tenant
from jobs.scheduling import ClusterSnapshot, GpuState, JobRequest, NodeState, TenantQuota
from monitoring.models import Gpu, Node
from monitoring.services.health import live_node_names


def build_snapshot(redis_client) -> ClusterSnapshot:
    nodes = list(Node.objects.all())
    online = live_node_names(redis_client, [node.name for node in nodes])
    busy = set(Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
    gpus_by_node: dict[int, list[GpuState]] = defaultdict(list)
    for gpu in Gpu.objects.filter(present=True).order_by("index"):
        gpus_by_node[gpu.node_id].append(
            GpuState(id=gpu.id, index=gpu.index, model=gpu.model, memory_mib=gpu.memory_mib, busy=gpu.id in busy)
        )
    pending = tuple(
        JobRequest(
            id=job.id, tenant=job.tenant.slug, gpus=job.gpus, gpu_memory_mib=job.gpu_memory_mib,
            priority=job.priority, submitted_at=job.submitted_at.timestamp(),
        )
        for job in Job.objects.filter(state=JobState.PENDING).select_related("tenant")
    )
    return ClusterSnapshot(
        nodes=tuple(
            NodeState(name=node.name, gpus=tuple(gpus_by_node[node.id]), online=node.name in online,
                      cordoned=node.cordoned)
            for node in nodes
        ),
        pending=pending,
        tenants=tuple(
            TenantQuota(name=t.slug, guaranteed_gpus=t.guaranteed_gpus, max_gpus=t.max_gpus, weight=t.weight)
            for t in Tenant.objects.all()
        ),
    )
