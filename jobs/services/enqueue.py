"""Queue a Celery task of ``jobs.tasks`` from a service, by its name.

Tasks call services (``jobs/tasks.py``); a service that hands work to a worker (a cycle now, a
notification to deliver) must not import the tasks back, or the two layers become one import
cycle. So it names the task here and Celery's registry finds it: the same task object, routing
and eager mode as calling the task itself. ``JobsConfig.ready`` imports ``jobs.tasks``, so the
tasks are registered in every process that can queue them.
"""

from __future__ import annotations

from celery import current_app


def enqueue(task: str, *args, **options) -> None:
    """Queue ``jobs.tasks.<task>(*args)`` (``options`` as for ``apply_async``). What the broker
    raises reaches the caller, which decides whether a lost message matters."""
    current_app.tasks[f"jobs.tasks.{task}"].apply_async(args, **options)
