"""Server-rendered pages for researchers."""

from django.contrib.auth.mixins import LoginRequiredMixin
from django.views.generic import ListView

from jobs.models import Job


class QueueView(LoginRequiredMixin, ListView):
    template_name = "jobs/queue.html"
    context_object_name = "jobs"
    paginate_by = 100

    def get_queryset(self):
        return (
            Job.objects.visible_to(self.request.user)
            .select_related("tenant", "owner")
            .prefetch_related("allocations__gpu__node")
        )
