"""What one user may read about jobs that are not theirs to see.

Cluster-wide facts (which GPU is busy, an alert's node) are everyone's; a job is named only where
``Job.objects.visible_to(user)`` holds it, and reads :data:`OTHER_TENANT` anywhere else: in the
overview's open alerts and on the node page's GPU holders.
"""

from __future__ import annotations

from jobs.models import Job
from jobs.services.gpu_usage import live_holders
from monitoring.choices import AlertKind
from monitoring.models import Alert
from monitoring.services.gpu_holders import GpuHolder

OTHER_TENANT = "another tenant's job"
MAX_ALERTS = 50


def visible_job_ids(jobs, job_ids) -> set[int]:
    """Of ``job_ids``, those in ``jobs``: a queryset already scoped to what the reader may see
    (an API view's ``self.queryset``)."""
    return set(jobs.filter(pk__in=set(job_ids)).values_list("pk", flat=True))


def gpu_holders(user, gpu_ids: list[int]) -> dict[int, list[GpuHolder]]:
    """GPU id -> the jobs holding it now, oldest first, named only where ``user`` may see them
    (installed into :mod:`monitoring.services.gpu_holders` for the node page)."""
    held = live_holders(gpu_ids)
    job_ids = [a.job_id for allocations in held.values() for a in allocations]
    visible = visible_job_ids(Job.objects.visible_to(user), job_ids)
    return {
        gpu_id: [
            GpuHolder(job_id=a.job_id, job_name=a.job.name, tenant=a.job.tenant.slug,
                      label=f"#{a.job_id} {a.job.name} ({a.job.tenant.slug})",
                      gpu_milli=a.gpu_milli, duty_cycle=a.duty_cycle)
            if a.job_id in visible else
            GpuHolder(job_id=None, job_name=None, tenant=None, label=OTHER_TENANT,
                      gpu_milli=a.gpu_milli, duty_cycle=a.duty_cycle)
            for a in allocations
        ]
        for gpu_id, allocations in held.items()
    }


def open_alerts(jobs) -> list[dict]:
    """The newest open alerts; one about a job not in ``jobs`` (what the reader may see) names no job."""
    alerts = list(
        Alert.objects.filter(resolved_at__isnull=True).select_related("node", "gpu")
        .order_by("-last_seen_at")[:MAX_ALERTS]
    )
    visible = visible_job_ids(jobs, [a.job_id for a in alerts if a.job_id])
    labels = dict(AlertKind.choices)
    out = []
    for alert in alerts:
        gpu_index = alert.gpu.index if alert.gpu else None
        message, job_id = alert.message, alert.job_id
        if job_id and job_id not in visible:
            where = f"{alert.node.name}/gpu{gpu_index}" if gpu_index is not None else alert.node.name
            message, job_id = f"{labels.get(alert.kind, alert.kind)} on {where} ({OTHER_TENANT})", None
        out.append({
            "id": alert.pk, "kind": alert.kind, "kind_label": labels.get(alert.kind, alert.kind),
            "node": alert.node.name, "gpu_index": gpu_index, "job_id": job_id, "message": message,
            "opened_at": alert.opened_at, "last_seen_at": alert.last_seen_at,
        })
    return out
