from django.apps import AppConfig


class ClusterUiConfig(AppConfig):
    name = "cluster_ui"
    verbose_name = "Colony"

    def ready(self):
        # Bind @shared_task to our app in every Django process (web, ingest, manage.py).
        from cluster_ui.celery import app  # noqa: F401
