from django.urls import path

from jobs import notebook_views, notification_views, views

app_name = "jobs"

urlpatterns = [
    path("", views.QueueView.as_view(), name="queue"),
    path("submit/", views.SubmitView.as_view(), name="submit"),
    path("<int:pk>/", views.JobDetailView.as_view(), name="detail"),
    path("<int:pk>/cancel/", views.cancel, name="cancel"),
    path("<int:pk>/notebook/", notebook_views.open_notebook, name="notebook"),
    path("usage/", views.UsageView.as_view(), name="usage"),
    path("members/<slug:slug>/", views.members, name="members"),
    path("usage.csv", views.usage_csv, name="usage-csv"),
    path("notifications/", notification_views.notification_settings, name="notifications"),
]
