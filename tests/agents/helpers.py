"""Helpers for the node agent tests: build commands, read the events stream, wait for things."""

from __future__ import annotations

import itertools
import sys
import time
import uuid

import psutil
import pytest

from agents import protocol, signing

_job_ids = itertools.count(1)


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy; return that, or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


def python(code: str) -> list[str]:
    """argv running ``code`` in this interpreter."""
    return [sys.executable, "-c", code]


def launch(argv: list[str], job_id: int | None = None, gpus=(), env=None, command_id=None,
           **fields) -> protocol.LaunchJob:
    """A LaunchJob; ``fields`` sets the rest (``duty_cycle``, ``gpu_memory_limit_mib``)."""
    return protocol.LaunchJob(
        command_id=command_id or f"launch-{uuid.uuid4().hex[:12]}",
        job_id=job_id or next(_job_ids),
        argv=argv,
        gpu_indices=list(gpus),
        env=env or {},
        **fields,
    )


def command(kind, job_id: int, command_id=None, **fields):
    """A SetDutyCycle, SuspendJob or ResumeJob with a fresh command id unless given."""
    return kind(command_id=command_id or f"{kind.__name__.lower()}-{uuid.uuid4().hex[:12]}", job_id=job_id, **fields)


def node_entries(client, kind: str) -> list:
    """Every entry agents wrote on their own ``kind`` streams ("events", "metrics"), oldest first."""
    streams = sorted(client.scan_iter(match=f"colony:node:*:{kind}", _type="stream"))
    return sorted((entry for stream in streams for entry in client.xrange(stream)), key=lambda e: _id_key(e[0]))


def _id_key(entry_id) -> tuple[int, int]:
    ms, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")
    return int(ms), int(seq)


def samples(client) -> list[protocol.NodeSample]:
    """Every decoded sample the agents wrote, oldest first."""
    return [protocol.decode_sample(fields) for _id, fields in node_entries(client, "metrics")]


def stop(job_id: int, grace: float = 5.0, command_id=None) -> protocol.StopJob:
    return protocol.StopJob(
        command_id=command_id or f"stop-{uuid.uuid4().hex[:12]}", job_id=job_id, grace_seconds=grace
    )


def events(client, kind: str | None = None) -> list:
    """Every decoded message on the events stream, oldest first (optionally of one kind)."""
    decoded = [protocol.decode_event(fields) for _id, fields in node_entries(client, "events")]
    return [event for event in decoded if kind is None or event.kind == kind]


def send(client, node: str, command) -> None:
    client.xadd(protocol.command_stream(node), protocol.encode(command))


def send_signed(client, node: str, command, key: bytes) -> None:
    """``command`` as the control plane sends it to an agent holding ``key``: naming ``node`` and
    issued now, MACed with the key (a launch must name its attempt: ``launch(..., attempt=0)``)."""
    stamped = command.model_copy(update={"node": node, "issued_at": time.time()})
    client.xadd(protocol.command_stream(node), signing.signed_command(protocol.encode(stamped), key))


def status(pid: int) -> str:
    """psutil's status of ``pid`` ("stopped", "running", "sleeping" ...), "gone" if it is no more."""
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def gone(pid: int) -> bool:
    """The process no longer runs (an unreaped zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
