"""The Django project: settings, URLs, the Celery app and the overview pages.

The Celery app is loaded by ``ClusterUiConfig.ready`` (so that ``@shared_task`` binds to it in web
processes), not here: the ``colony`` CLI lives in this package and must start without Django.
"""
