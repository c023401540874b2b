"""Celery tasks: thin wrappers that call one service each."""

from celery import shared_task

from jobs.services import alerts as job_alerts
from jobs.services import code, idle_reclaim, job_logs, node_health, notifications
from jobs.services.agent_events import consume_events
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.services.redis_client import get_redis


# Safe on any number of workers at once: the cycle writes only under the scheduler lease
# (jobs/services/leadership.py), and a worker that lost it meanwhile has its decisions refused.
@shared_task(ignore_result=True)
def scheduling_cycle() -> dict:
    result = run_scheduling_cycle()
    return {"ran": result.ran, "placed": result.placed, "pending": result.pending, "fenced": result.fenced}


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


# Five tries in all, 15 s apart at first, doubling (with jitter) up to 10 min: a chat service's
# outage of a few minutes is ridden out; after the last try the notification reads "gave up".
@shared_task(bind=True, ignore_result=True, autoretry_for=(notifications.TryAgain,), retry_backoff=15,
             retry_backoff_max=600, retry_jitter=True, max_retries=notifications.MAX_TRIES - 1)
def send_notification(self, notification_id: int) -> str:
    return notifications.deliver(notification_id, try_number=self.request.retries,
                                 last_try=self.request.retries >= self.max_retries)


@shared_task(ignore_result=True)
def announce_alerts(alert_ids: list[int], phase: str) -> int:
    return job_alerts.announce(alert_ids, phase)


# The same policy as send_notification: an operator's chat service down for minutes is ridden out.
@shared_task(bind=True, ignore_result=True, autoretry_for=(notifications.TryAgain,), retry_backoff=15,
             retry_backoff_max=600, retry_jitter=True, max_retries=notifications.MAX_TRIES - 1)
def send_alert_notification(self, dedupe_key: str, user_id: int, channel: str, event: str, message: dict) -> str:
    return job_alerts.deliver(dedupe_key, user_id, channel, event, message,
                              last_try=self.request.retries >= self.max_retries)


@shared_task(ignore_result=True)
def notify_long_waits() -> int:
    return notifications.notify_long_waits()


@shared_task(ignore_result=True)
def redeliver_notifications() -> int:
    return notifications.redeliver_stuck()


@shared_task(ignore_result=True)
def purge_unused_code() -> int:
    return code.purge_unused()


# One beat at a time is enough; a second worker running it at once takes no step twice (the
# lifecycle's idle steps lock the job's row and check the step was not taken in this spell).
@shared_task(ignore_result=True)
def reclaim_idle_gpus() -> dict:
    return idle_reclaim.reclaim()
