"""Celery tasks: thin wrappers that call one service each."""

from celery import shared_task

from jobs.services import alerts as job_alerts
from jobs.services import job_logs
from jobs.services import node_health
from jobs.services.agent_events import consume_events
from jobs.services.cycle import run_scheduling_cycle
from monitoring.services.redis_client import get_redis


@shared_task(ignore_result=True)
def scheduling_cycle() -> dict:
    result = run_scheduling_cycle()
    return {"ran": result.ran, "placed": result.placed, "pending": result.pending}


@shared_task(ignore_result=True)
def consume_agent_events() -> int:
    return consume_events()


@shared_task(ignore_result=True)
def consume_job_logs() -> int:
    return job_logs.consume_logs()


@shared_task(ignore_result=True)
def check_node_health() -> dict:
    return node_health.check_node_health(get_redis())


@shared_task(ignore_result=True)
def evaluate_alerts() -> int:
    return job_alerts.evaluate()
