"""The Celery app. Workers: ``celery -A cluster_ui worker -Q celery``; the scheduler, one process
that alone runs scheduling cycles (``CELERY_TASK_ROUTES``, jobs/services/scheduling_loop.py):
``celery -A cluster_ui worker --pool solo -Q scheduler``; beat: ``celery -A cluster_ui beat``."""

import os

from celery import Celery, signals

from agents.hardening import make_non_dumpable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cluster_ui.settings")

app = Celery("colony")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
@signals.beat_init.connect
def _harden(**_kwargs):
    # Worker and beat hold the agent secret and the Redis password: no job may read their memory.
    # (Pool processes and an embedded beat are forked from here and inherit it.)
    make_non_dumpable()
