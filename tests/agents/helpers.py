"""Helpers for the node agent tests: build commands, read the events stream, wait for things."""

from __future__ import annotations

import itertools
import sys
import time
import uuid

import psutil
import pytest

from agents import protocol

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


def launch(argv: list[str], job_id: int | None = None, gpus=(), env=None, command_id=None, **fields) -> protocol.LaunchJob:
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


def samples(client) -> list[protocol.NodeSample]:
    """Every decoded message on the metrics stream, oldest first."""
    return [protocol.decode_sample(fields) for _id, fields in client.xrange(protocol.METRICS_STREAM)]


def stop(job_id: int, grace: float = 5.0, command_id=None) -> protocol.StopJob:
    return protocol.StopJob(
        command_id=command_id or f"stop-{uuid.uuid4().hex[:12]}", job_id=job_id, grace_seconds=grace
    )


def events(client, kind: str | None = None) -> list:
    """Every decoded message on the events stream, oldest first (optionally of one kind)."""
    decoded = [protocol.decode_event(fields) for _id, fields in client.xrange(protocol.EVENTS_STREAM)]
    return [event for event in decoded if kind is None or event.kind == kind]


def send(client, node: str, command) -> None:
    client.xadd(protocol.command_stream(node), protocol.encode(command))


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
