from django.apps import AppConfig


class ClusterUiConfig(AppConfig):
    name = "cluster_ui"
    verbose_name = "Colony"

    def ready(self):
        # Bind @shared_task to our app in every Django process (web, ingest, manage.py).
        from cluster_ui.celery import app  # noqa: F401

        # Every change made in the admin goes to the audit log (cluster_ui/audit.py).
        from django.contrib.admin.models import LogEntry
        from django.db.models.signals import post_save

        from cluster_ui.audit import from_admin_log

        post_save.connect(from_admin_log, sender=LogEntry, dispatch_uid="colony-audit-admin-log")
