from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs and tenants"

    def ready(self) -> None:
        from monitoring.services import placements

        placements.install(_placed_on)


def _placed_on(pairs: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Of ``(node, job_id)`` pairs, those where the job holds or held GPUs on that node (a job's
    last samples may arrive just after its allocation was released)."""
    from jobs.models import Allocation

    nodes = {node for node, _ in pairs}
    job_ids = {job_id for _, job_id in pairs}
    found = set(Allocation.objects.filter(job_id__in=job_ids, gpu__node__name__in=nodes)
                .values_list("gpu__node__name", "job_id").distinct())
    return found & pairs
