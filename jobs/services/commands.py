"""Publishing commands to node agents (each node has its own command stream).

Every command is stamped with the node it is for and the time it is issued, and, when
``COLONY_AGENT_SECRET`` is set, MACed with that node's key (:func:`agents.signing.sign_command`):
an agent holding its key refuses anything else, so a client of Redis that can append to a
command stream cannot make a node run anything. Re-sends are issued afresh, so they are fresh.

A launch says how its job was admitted (``LaunchJob.job_class``, the job's ``run_class`` when it
was placed) and, for a borrower, the floor of its duty cycle (the scheduler's): the node then cuts
a borrower beside a saturated guaranteed job by itself, and the duty cycles sent here are the
borrower's ceiling (:mod:`agents.local_coordinator`).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid

import redis
from django.conf import settings

from agents import protocol, signing
from jobs.choices import RunClass
from jobs.services import code
from jobs.services.notebook_tokens import launch_env as notebook_launch_env
from jobs.services.scheduler_config import scheduler_config
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
            protocol.command_stream(node), command_fields(node, command), maxlen=protocol.STREAM_MAXLEN,
            approximate=True,
        )
    except redis.RedisError as exc:
        log.error("could not send %s for job %s to node %s: %s", command.kind, command.job_id, node, exc)


def publish_many(commands: list[tuple[str, object]]) -> None:
    """Add each (node, command) to its node's stream in one round trip (a pipeline, not a
    transaction: each XADD stands alone). A failure is logged, as in :func:`_publish`."""
    if not commands:
        return
    try:
        with get_redis().pipeline(transaction=False) as pipe:
            for node, command in commands:
                pipe.xadd(protocol.command_stream(node), command_fields(node, command),
                          maxlen=protocol.STREAM_MAXLEN, approximate=True)
            pipe.execute()
    except redis.RedisError as exc:
        log.error("could not send %d commands (first: %s for job %s to node %s): %s", len(commands),
                  commands[0][1].kind, commands[0][1].job_id, commands[0][0], exc)


def command_fields(node: str, command, now: float | None = None) -> dict[str, str]:
    """The stream fields of ``command`` for ``node``: stamped with the node and the time it is
    issued, and MACed with the node's key when there is a secret to derive it from."""
    command = command.model_copy(update={"node": node, "issued_at": time.time() if now is None else now})
    return signing.signed_command(protocol.encode(command), command_key(node))


def command_key(node: str) -> bytes | None:
    """``node``'s key (the one its agent holds), or None without a usable ``COLONY_AGENT_SECRET``
    (settings refuse a short one unless authentication is off; then commands go unsigned)."""
    secret = settings.COLONY_AGENT_SECRET
    return _node_key(secret, node) if secret and len(secret) >= signing.MIN_SECRET_LENGTH else None


@functools.lru_cache(maxsize=4096)
def _node_key(secret: str, node: str) -> bytes:
    return signing.node_key(secret, node)


def _command_id(kind: str, job_id: int) -> str:
    return f"{kind}-{job_id}-{uuid.uuid4().hex[:8]}"


def launch_id(job_id: int, attempt: int) -> str:
    """The LaunchJob command id of a job's attempt (attempt = requeues + preemptions so far)."""
    return f"launch-{job_id}-{attempt}"


def send_launch(node: str, job_id: int, argv: list[str], gpu_indices: tuple[int, ...], *, attempt: int = 0,
                env: dict[str, str] | None = None, gpu_memory_limit_mib: int | None = None,
                duty_cycle: float = 1.0, tenant: str | None = None, max_runtime_s: int | None = None,
                code_id: int | None = None, **spec) -> None:
    """``spec``: the launch's other fields (workdir, image, venv, conda, stop_signal, array_id,
    array_index). ``code_id``: an archive the job starts in, staged for the node first; a launch
    that cannot be staged is not sent (the scheduling loop re-sends unstarted launches)."""
    for command in launch_commands(node, job_id, argv, gpu_indices, attempt=attempt, env=env,
                                   gpu_memory_limit_mib=gpu_memory_limit_mib, duty_cycle=duty_cycle, tenant=tenant,
                                   max_runtime_s=max_runtime_s, code_id=code_id, **spec):
        _publish(node, command)


def launch_commands(node: str, job_id: int, argv: list[str], gpu_indices: tuple[int, ...], *, attempt: int = 0,
                    env: dict[str, str] | None = None, gpu_memory_limit_mib: int | None = None,
                    duty_cycle: float = 1.0, tenant: str | None = None, max_runtime_s: int | None = None,
                    code_id: int | None = None, job_class: str | None = None, **spec) -> list:
    """The commands that launch an attempt on ``node`` (see :func:`send_launch`); none when its
    code cannot be staged. ``job_class``: the job's ``run_class`` (blank or None: not said, and
    its node leaves its duty cycle to the control plane)."""
    # One command id per attempt: a re-sent launch of this attempt is recognised by the agent, a
    # requeued job's next attempt is not mistaken for it. The submitter (``user``, ``posix_user`` in
    # ``spec``) picks the account the node runs it as; the tenant, the operator's fallback account.
    # A job suspended before it started (duty cycle 0) is launched throttled and suspended at once.
    if code_id is not None:
        try:
            spec["code"] = code.stage(get_redis(), node, code_id)
        except redis.RedisError as exc:
            log.error("could not stage the code of job %s for node %s: %s", job_id, node, exc)
            return []
    if job_class == RunClass.OPPORTUNISTIC:
        spec.update(job_class="opportunistic", duty_cycle_floor=scheduler_config().duty_cycle_floor)
    elif job_class == RunClass.GUARANTEED:
        spec["job_class"] = "guaranteed"
    commands = [protocol.LaunchJob(
        command_id=launch_id(job_id, attempt), attempt=attempt, job_id=job_id, argv=argv,
        gpu_indices=list(gpu_indices), env=notebook_launch_env(env or {}, launch_id(job_id, attempt)),
        gpu_memory_limit_mib=gpu_memory_limit_mib,
        duty_cycle=duty_cycle if duty_cycle > 0 else SUSPENDED_LAUNCH_DUTY_CYCLE, tenant=tenant,
        max_runtime_s=max_runtime_s, stop_grace_s=settings.COLONY_STOP_GRACE_SECONDS, **spec,
    )]
    if duty_cycle <= 0:
        commands.append(protocol.SuspendJob(command_id=_command_id("suspend", job_id), job_id=job_id))
    return commands


def send_stop(node: str, job_id: int, launch_id: str | None = None, *, preempt_grace_s: float | None = None) -> None:
    """Stop the job on ``node``: only the attempt ``launch_id`` when given (a stop for one run
    never ends a later one), else whatever of the job runs there. ``preempt_grace_s``: this is a
    preemption, with that much notice (the node writes the deadline where the job can read it)."""
    _publish(node, protocol.StopJob(
        command_id=_command_id("stop", job_id), job_id=job_id, launch_id=launch_id,
        grace_seconds=settings.COLONY_STOP_GRACE_SECONDS if preempt_grace_s is None else preempt_grace_s,
        preempt=preempt_grace_s is not None,
    ))


def send_query(node: str, job_id: int, launch_id: str) -> None:
    """Ask ``node`` how attempt ``launch_id`` stands there; it answers on its events stream."""
    _publish(node, protocol.QueryAttempt(command_id=_command_id("query", job_id), job_id=job_id, launch_id=launch_id))


def send_duty_cycle(node: str, job_id: int, duty_cycle: float, *, resume: bool = False) -> None:
    """Throttle the job to ``duty_cycle``; 0 suspends it. ``resume``: it was suspended, so continue
    it under the new duty cycle (a resume of a job that is not suspended does nothing)."""
    for target, command in duty_cycle_commands(node, job_id, duty_cycle, resume=resume):
        _publish(target, command)


def duty_cycle_commands(node: str, job_id: int, duty_cycle: float, *, resume: bool = False) -> list[tuple[str, object]]:
    """What :func:`send_duty_cycle` sends, as (node, command) pairs for :func:`publish_many`."""
    if duty_cycle <= 0:
        return [(node, protocol.SuspendJob(command_id=_command_id("suspend", job_id), job_id=job_id))]
    commands = [(node, protocol.SetDutyCycle(command_id=_command_id("duty", job_id), job_id=job_id,
                                             duty_cycle=duty_cycle))]
    if resume:
        commands.append((node, protocol.ResumeJob(command_id=_command_id("resume", job_id), job_id=job_id)))
    return commands
