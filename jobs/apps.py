from datetime import timedelta

from django.apps import AppConfig
from django.db.models import Q
from django.utils import timezone

# How long after its GPUs were released a node may still report on a job: its last samples may
# arrive just after it ended. Past this, what the node says about the job is dropped.
REPORT_GRACE = timedelta(seconds=60)


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs and tenants"

    def ready(self) -> None:
        # Imported here, not at the top: Django loads this module before any app's models exist.
        from jobs import state_guard
        from jobs import tasks  # noqa: F401  (registers them: services queue them by name, jobs/services/enqueue.py)
        from jobs.services import alerts  # noqa: F401  (connects the alert-notification receivers)
        from jobs.services.visibility import gpu_holders as visible_gpu_holders
        from monitoring.services import gpu_holders, placements

        placements.install(_placed_on)
        gpu_holders.install(visible_gpu_holders)
        state_guard.install()


def _placed_on(pairs: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Of ``(node, job_id)`` pairs, those where the job holds GPUs on that node, or released them
    within :data:`REPORT_GRACE` (a job's last samples may arrive just after its allocation was
    released). A node that held the job's GPUs in an earlier attempt long ago speaks for it no more."""
    from jobs.models import Allocation  # (not at the top: this module is loaded before the models exist)

    nodes = {node for node, _ in pairs}
    job_ids = {job_id for _, job_id in pairs}
    recent = Q(released_at__isnull=True) | Q(released_at__gte=timezone.now() - REPORT_GRACE)
    found = set(Allocation.objects.filter(recent, job_id__in=job_ids, gpu__node__name__in=nodes)
                .values_list("gpu__node__name", "job_id").distinct())
    return found & pairs
