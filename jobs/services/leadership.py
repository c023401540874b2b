"""Scheduler leadership: a lease row in the database with an epoch, and the fence every decision
transaction passes through. Nothing here decides anything; :mod:`jobs.services.scheduling_loop` uses it.

Why a lease row and not a PostgreSQL advisory lock: an advisory lock belongs to a database
session, and a scheduler stopped by SIGSTOP, a long GC pause or a frozen VM keeps its session
open (its kernel still answers TCP keepalives), so it would keep leadership for as long as it is
stopped. A lease expires by the database's clock whatever its holder is doing, works the same on
SQLite (the embedded default) and through a transaction-pooling PgBouncer, and its row carries the
epoch that fences a holder which was presumed dead but was only paused.

The row (:class:`jobs.models.SchedulerLease`, one per name) holds ``holder`` (host, process and a
random token: never reused by a later process or thread), ``epoch`` and ``expires_at``. Every time
is the database's (``Now()``), so scheduler hosts whose clocks drift cannot disagree about it.

- :func:`acquire` takes the lease for a cycle when it is free (handed back, or expired) or
  already ours (the leader renews the lease it kept since its last cycle). Passing to another
  holder adds one to the epoch; the same holder keeps its epoch.
  The row is read ``FOR UPDATE NOWAIT``: a holder inside a decision transaction holds that row, so
  a would-be leader skips this tick instead of queueing behind it.
- :func:`fenced` opens the transaction a cycle writes its decisions in (``apply_decisions``'
  own ``atomic`` becomes a savepoint inside it). Its first statement renews the lease *only if*
  holder and epoch are still ours; if not, :class:`Superseded` is raised and the transaction
  rolls back: nothing written, and the commands published ``on_commit`` never go out. While it is
  open the renewed row stays locked, so no one can take the lease between the check and the
  commit: a decision that commits was made by the leader of record.
- A holder stopped *inside* that transaction would hold the row (and the jobs it has written)
  while stopped. On PostgreSQL the transaction (when it is one of its own, as in a worker, not
  nested in a caller's) sets ``idle_in_transaction_session_timeout`` to half the lease, so the
  server ends a stopped holder's session (rolling its writes back and freeing the row) before its
  lease runs out, and the standby takes over on time. (A holder stopped while the server is still
  sending it a large result is not "idle"; PostgreSQL 17's ``transaction_timeout`` would cover
  that case too.)
- :func:`release` hands the lease back: at a warm shutdown, or after a cycle that failed. A cycle
  that ends well keeps it (:mod:`jobs.services.scheduling_loop`), so the epoch moves only on a
  real takeover, never because ticks reached two scheduler processes in turn. A holder that never
  hands it back (stopped, killed, partitioned) loses it when it expires.

- :class:`LeaseKeeper` renews the lease from a small daemon thread every third of the lease while
  a cycle holds it, so that a slow cycle (a cold one: snapshot and decide of a large backlog under
  load) keeps the lease instead of being fenced off and computed again by another process. It is
  safe because what keeps the lease alive is the process actually running, never a session or a
  timer elsewhere:

  - A stopped process (SIGSTOP, a frozen VM) stops all its threads, the keeper too: its lease
    expires as before, the standby takes over, and the stopped cycle's writes stay fenced by epoch.
  - Each renewal is *one* autocommit statement that changes the row only if holder and epoch are
    still ours and the lease was not handed back, and (on PostgreSQL) only if nobody has the row
    locked (``FOR UPDATE NOWAIT``): it never waits in the server behind a lock, so a renewal sent
    just before the process was stopped cannot land later (for instance when the server ends the
    stopped holder's fenced transaction), and it never leaves an open transaction that would
    hold the row while the process is stopped.
  - A cycle that hangs with its process running (a blocked socket) is renewed only up to
    ``COLONY_SCHEDULER_MAX_CYCLE_S`` (300 s); after that the keeper stops and the lease expires.
  - A renewal that finds the lease superseded stops the keeper and marks it :attr:`LeaseKeeper.lost`;
    the cycle's next fenced transaction is refused as before. Renewal only ever *extends* a lease
    its holder still owns: it never takes one, nor changes an epoch.

Failover: a holder stopped mid-cycle is replaced at the first tick after its lease expires, at
most ``COLONY_SCHEDULER_LOCK_LEASE`` (default 30 s) after it last renewed plus one tick
(``COLONY_SCHEDULER_INTERVAL``); one stopped between cycles is waited for as long (it keeps its
lease between cycles), one shut down warm hands it back and is not waited for.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError, IntegrityError, OperationalError, connection, connections, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from jobs.models import SchedulerLease

log = logging.getLogger(__name__)

SCHEDULER = "scheduler"
# PostgreSQL's codes: a row another transaction locks (NOWAIT), and a session the server ended
# because it sat idle inside a transaction.
LOCK_NOT_AVAILABLE = "55P03"
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    epoch: int
    # A holder whose lease expired without being handed back: it died, or is paused.
    took_over_from: str = ""


class Superseded(Exception):
    """The lease passed to another holder since this one took it: its decisions must not land."""

    def __init__(self, lease: Lease, holder: str, epoch: int):
        super().__init__(f"lease {lease.name!r} epoch {lease.epoch} of {lease.holder} was taken over by "
                         f"{holder or 'nobody'} (epoch {epoch})")
        self.lease, self.holder, self.epoch = lease, holder, epoch


_local = threading.local()


def holder_id() -> str:
    """This process and thread, as a lease holder: a forked child or a new thread is a new holder."""
    if getattr(_local, "pid", None) != os.getpid():
        _local.pid = os.getpid()
        _local.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    return _local.holder


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def session_ended_while_idle(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL having ended this session for sitting idle inside a fenced
    transaction (this process was stopped past half its lease): nothing of it was committed."""
    return _sqlstate(exc) == IDLE_IN_TRANSACTION_TIMEOUT


def acquire(lease_s: float, name: str = SCHEDULER) -> Lease | None:
    """Take (or keep) the lease ``name`` for ``lease_s`` seconds; None while another holds it."""
    me = holder_id()
    until = Now() + timedelta(seconds=lease_s)
    try:
        with transaction.atomic():
            row = (SchedulerLease.objects.select_for_update(nowait=True).filter(name=name)
                   .annotate(expired=ExpressionWrapper(Q(expires_at__lte=Now()), output_field=BooleanField()))
                   .values("holder", "epoch", "expired", "released").first())
            if row is None:
                with transaction.atomic():
                    SchedulerLease.objects.create(name=name, holder=me, epoch=1, expires_at=until, acquired_at=Now(),
                                                  released=False)
                return Lease(name, me, 1)
            if row["holder"] != me and not row["expired"]:
                return None
            changes = {"holder": me, "expires_at": until, "released": False}
            if row["holder"] != me:
                changes.update(epoch=row["epoch"] + 1, acquired_at=Now())
            SchedulerLease.objects.filter(name=name).update(**changes)
    except IntegrityError:
        return None  # another process created the row first; it holds the lease
    except OperationalError as exc:
        if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
            return None  # its holder is inside a decision transaction
        raise
    if row["holder"] == me:
        return Lease(name, me, row["epoch"])
    return Lease(name, me, row["epoch"] + 1, took_over_from="" if row["released"] else row["holder"])


@contextmanager
def fenced(lease: Lease, lease_s: float):
    """A transaction that commits only if ``lease`` is still the lease of record (see the module
    docstring); raises :class:`Superseded` before anything is written otherwise."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        # Only for a transaction of its own: a caller's enclosing transaction keeps its settings.
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                               [str(max(1, int(lease_s * 500)))])
        renewed = SchedulerLease.objects.filter(name=lease.name, holder=lease.holder, epoch=lease.epoch).update(
            expires_at=Now() + timedelta(seconds=lease_s), released=False)
        if not renewed:
            now = SchedulerLease.objects.filter(name=lease.name).values_list("holder", "epoch").first() or ("", 0)
            raise Superseded(lease, *now)
        yield


def release(lease: Lease) -> None:
    """Hand the lease back (if it is still ours) so that the next tick's process may take it."""
    SchedulerLease.objects.filter(name=lease.name, holder=lease.holder, epoch=lease.epoch).update(
        expires_at=Now(), released=True)


def current(name: str = SCHEDULER) -> dict | None:
    """The lease of record as /metrics shows it: holder, epoch, and whether it is held now."""
    return (SchedulerLease.objects.filter(name=name)
            .annotate(held=ExpressionWrapper(Q(expires_at__gt=Now(), released=False), output_field=BooleanField()))
            .values("holder", "epoch", "held", "acquired_at").first())


def renew(lease: Lease, lease_s: float) -> bool | None:
    """Push ``lease``'s expiry ``lease_s`` on from now, only if it is still ours and not handed back.

    True: renewed. False: it is not ours any more (another holder or epoch, or handed back).
    None: not known this time (the row is locked, by our own fenced transaction or a would-be
    leader's look at it, or the database did not answer): try again later.
    One statement in autocommit, never waiting on a lock (see the module docstring)."""
    try:
        if connection.vendor == "postgresql":
            table = connection.ops.quote_name(SchedulerLease._meta.db_table)
            with connection.cursor() as cursor:
                # statement_timestamp(), not now(): the same as Now() here (autocommit), said plainly.
                cursor.execute(
                    f"UPDATE {table} SET expires_at = statement_timestamp() + make_interval(secs => %s) "
                    f"WHERE name = %s AND holder = %s AND epoch = %s AND NOT released "
                    f"AND name = (SELECT name FROM {table} WHERE name = %s FOR UPDATE NOWAIT)",
                    [float(lease_s), lease.name, lease.holder, lease.epoch, lease.name])
                renewed = cursor.rowcount
        else:
            renewed = SchedulerLease.objects.filter(name=lease.name, holder=lease.holder, epoch=lease.epoch,
                                                    released=False).update(
                expires_at=Now() + timedelta(seconds=lease_s))
        if renewed:
            return True
        row = SchedulerLease.objects.filter(name=lease.name).values("holder", "epoch", "released").first()
    except DatabaseError as exc:
        if _sqlstate(exc) != LOCK_NOT_AVAILABLE:
            log.warning("scheduler lease not renewed this time (%s)", exc)
        return None
    if row is None:
        return None  # not visible from here (a test's uncommitted row): nothing proves it lost
    return False if (row["holder"], row["epoch"], row["released"]) != (lease.holder, lease.epoch, False) else None


class LeaseKeeper:
    """Renews ``lease`` from a daemon thread every third of ``lease_s`` while a cycle holds it
    (``with LeaseKeeper(...)``), for at most ``max_hold_s``; ``also`` runs after each renewal
    (the loop extends its Redis lock there). See the module docstring for why this is safe."""

    def __init__(self, lease: Lease, lease_s: float, max_hold_s: float, also: Callable[[], None] | None = None):
        self.lease, self.lease_s, self.max_hold_s, self.also = lease, lease_s, max_hold_s, also
        self.renewals = 0
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-keeper-{lease.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """Renew no more; wait (briefly) for a renewal in flight. A renewal that lands after this
        returns changes nothing once the lease is handed back (it only renews a lease not released)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.lease_s / 3))

    def check(self) -> None:
        """Raise :class:`Superseded` if a renewal found the lease taken over (the cycle can stop
        early; its fenced transaction would be refused anyway)."""
        if self.lost:
            now = SchedulerLease.objects.filter(name=self.lease.name).values_list("holder", "epoch").first()
            raise Superseded(self.lease, *(now or ("", 0)))

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_hold_s
        try:
            while not self._stop.wait(self.lease_s / 3):
                if time.monotonic() >= deadline:
                    log.error("scheduling cycle has held the lease for %.0fs (COLONY_SCHEDULER_MAX_CYCLE_S): no "
                              "longer renewed, it expires in %ss and another process may take over",
                              self.max_hold_s, self.lease_s)
                    return
                outcome = renew(self.lease, self.lease_s)
                if outcome is False:
                    self.lost = True
                    log.warning("scheduler lease epoch %d of %s was taken over while its cycle ran",
                                self.lease.epoch, self.lease.holder)
                    return
                if outcome:
                    self.renewals += 1
                    if self.also is not None:
                        self.also()
        except Exception:  # a keeper that fails only stops renewing: the lease then expires as before
            log.exception("scheduler lease keeper failed; the lease is no longer renewed")
        finally:
            connections.close_all()  # this thread's own connections only
