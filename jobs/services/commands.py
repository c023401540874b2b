"""Publishing commands to node agents (each node has its own command stream)."""

from __future__ import annotations

import uuid

from django.conf import settings

from agents import protocol
from monitoring.services.redis_client import get_redis


def _publish(node: str, command) -> None:
    get_redis().xadd(
        protocol.command_stream(node), protocol.encode(command), maxlen=protocol.STREAM_MAXLEN, approximate=True
    )


def send_launch(node: str, job_id: int, argv: list[str], gpu_indices: tuple[int, ...]) -> None:
    # The command id is derived from the job so that a re-sent launch is recognised by the agent.
    _publish(node, protocol.LaunchJob(
        command_id=f"launch-{job_id}", job_id=job_id, argv=argv, gpu_indices=list(gpu_indices),
    ))


def send_stop(node: str, job_id: int) -> None:
    _publish(node, protocol.StopJob(
        command_id=f"stop-{job_id}-{uuid.uuid4().hex[:8]}", job_id=job_id,
        grace_seconds=settings.COLONY_STOP_GRACE_SECONDS,
    ))
