"""Publishing commands to node agents (each node has its own command stream)."""

from __future__ import annotations

import logging
import uuid

import redis
from django.conf import settings

from agents import protocol
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

SUSPENDED_LAUNCH_DUTY_CYCLE = 0.1


def _publish(node: str, command) -> None:
    """Add a command to the node's stream. A failure is logged, not raised: commands are sent from
    on-commit callbacks, and one raising would drop the rest of the commit's commands (those of
    other nodes too). What is lost is re-sent: launches and stops while the job is still placed or
    stopping, duty cycles when the node registers again."""
    try:
        get_redis().xadd(
            protocol.command_stream(node), protocol.encode(command), maxlen=protocol.STREAM_MAXLEN, approximate=True
        )
    except redis.RedisError as exc:
        log.error("could not send %s for job %s to node %s: %s", command.kind, command.job_id, node, exc)


def _command_id(kind: str, job_id: int) -> str:
    return f"{kind}-{job_id}-{uuid.uuid4().hex[:8]}"


def launch_id(job_id: int, attempt: int) -> str:
    """The LaunchJob command id of a job's attempt (attempt = requeues + preemptions so far)."""
    return f"launch-{job_id}-{attempt}"


def send_launch(node: str, job_id: int, argv: list[str], gpu_indices: tuple[int, ...], *, attempt: int = 0,
                env: dict[str, str] | None = None, gpu_memory_limit_mib: int | None = None,
                duty_cycle: float = 1.0, tenant: str | None = None, max_runtime_s: int | None = None) -> None:
    # One command id per attempt: a re-sent launch of this attempt is recognised by the agent, a
    # requeued job's next attempt is not mistaken for it. The tenant picks the agent's run-as account.
    # A job suspended before it started (duty cycle 0) is launched throttled and suspended at once.
    _publish(node, protocol.LaunchJob(
        command_id=launch_id(job_id, attempt), job_id=job_id, argv=argv, gpu_indices=list(gpu_indices),
        env=env or {}, gpu_memory_limit_mib=gpu_memory_limit_mib, duty_cycle=duty_cycle if duty_cycle > 0 else
        SUSPENDED_LAUNCH_DUTY_CYCLE, tenant=tenant, max_runtime_s=max_runtime_s,
        stop_grace_s=settings.COLONY_STOP_GRACE_SECONDS,
    ))
    if duty_cycle <= 0:
        _publish(node, protocol.SuspendJob(command_id=_command_id("suspend", job_id), job_id=job_id))


def send_stop(node: str, job_id: int) -> None:
    _publish(node, protocol.StopJob(
        command_id=_command_id("stop", job_id), job_id=job_id, grace_seconds=settings.COLONY_STOP_GRACE_SECONDS,
    ))


def send_duty_cycle(node: str, job_id: int, duty_cycle: float, *, resume: bool = False) -> None:
    """Throttle the job to ``duty_cycle``; 0 suspends it. ``resume``: it was suspended, so continue
    it under the new duty cycle (a resume of a job that is not suspended does nothing)."""
    if duty_cycle <= 0:
        _publish(node, protocol.SuspendJob(command_id=_command_id("suspend", job_id), job_id=job_id))
        return
    _publish(node, protocol.SetDutyCycle(command_id=_command_id("duty", job_id), job_id=job_id,
                                         duty_cycle=duty_cycle))
    if resume:
        _publish(node, protocol.ResumeJob(command_id=_command_id("resume", job_id), job_id=job_id))
