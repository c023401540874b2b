from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "cluster_ui.sso"
    label = "sso"
    verbose_name = "Single sign-on"
    default_auto_field = "django.db.models.BigAutoField"
