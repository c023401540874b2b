"""Process hardening shared by every Colony process that holds a secret.

:func:`make_non_dumpable` is called once at the start of the agent (:mod:`agents.cli`), of every
Django process (``manage.py``, the WSGI/ASGI application, Celery worker and beat) and of the dev
stack's supervisor. A non-dumpable process (``prctl(PR_SET_DUMPABLE, 0)``) cannot be attached with
``ptrace`` by another process of the same uid, writes no core dump, and its ``/proc/<pid>/``
files (``environ``, ``mem``, ``maps``...) belong to root, so a job running under the same account
cannot read the secrets it holds in memory. ``execve`` makes a process dumpable again, so every
program calls it itself. Linux only; elsewhere it does nothing.

Standard library only: the agent imports this and must never import Django.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def make_non_dumpable() -> bool:
    """Make this process non-dumpable; True when it now is (False off Linux or if prctl failed)."""
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return is_dumpable() is False


def is_dumpable() -> bool | None:
    """This process's dumpable flag (None when it cannot be read here)."""
    prctl = _prctl()
    if prctl is None:
        return None
    value = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    return None if value < 0 else bool(value)
