from django.urls import path

from jobs.views import QueueView

app_name = "jobs"

urlpatterns = [
    path("", QueueView.as_view(), name="queue"),
]
