"""The Celery app. Workers: ``celery -A cluster_ui worker``; beat: ``celery -A cluster_ui beat``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")

app = Celery("colony")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
