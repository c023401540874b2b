from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Cluster monitoring"

    def ready(self):
        from monitoring import checks  # noqa: F401 (registers the deploy checks)
