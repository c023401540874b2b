"""Celery tasks: thin wrappers that call one service each."""

from celery import shared_task

from jobs.services.agent_events import consume_events
from jobs.services.cycle import run_scheduling_cycle


@shared_task(ignore_result=True)
def scheduling_cycle() -> dict:
    result = run_scheduling_cycle()
    return {"ran": result.ran, "placed": result.placed, "pending": result.pending}


@shared_task(ignore_result=True)
def consume_agent_events() -> int:
    return consume_events()
