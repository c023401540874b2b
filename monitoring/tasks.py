"""Celery tasks for monitoring: thin wrappers around one service each."""

from celery import shared_task

from monitoring.services import heatmap, live, retention
from monitoring.services.redis_client import get_redis


@shared_task(ignore_result=True)
def compact_rollups() -> int:
    return retention.compact_recent()


@shared_task(ignore_result=True)
def prune_rollups() -> int:
    return retention.prune() + live.prune_stale(get_redis())


@shared_task(ignore_result=True)
def warm_heatmap() -> int:
    return heatmap.warm_settled_blocks()
