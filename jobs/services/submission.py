"""Submitting, cancelling and requeueing jobs: the only places that create jobs or start a
cancel or an operator's requeue."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import F

from jobs.choices import JobState
from jobs.models import Job, JobArray, JobDependency, Tenant
from jobs.services import lifecycle, waits
from jobs.services.arrays import ArraySpec
from jobs.services.nudge import nudge_scheduler

# Rows per INSERT: a job has about 45 columns, and PostgreSQL takes at most 65,535 parameters.
BULK_INSERT_ROWS = 500


def tenants_of(user):
    """Tenants a user may submit to."""
    return Tenant.objects.filter(memberships__user=user)


def submission_context(user) -> dict:
    """What checking ``user``'s submissions reads about them, in one query: the tenants they may
    submit to (``tenants``) and the GPU cap a lead set for them in each (``member_caps``, tenant id
    -> GPUs, None for no limit), as ``JobSubmitSerializer`` takes them in its context."""
    read = _memberships_read()
    with connection.cursor() as cursor:
        cursor.execute(read.sql, [user.pk])
        rows = cursor.fetchall()
    tenants, caps = [], {}
    fields = len(read.attnames)
    for row in rows:
        if read.converters:  # none on PostgreSQL
            row = list(row)
            for position, (converters, expression) in read.converters:
                for converter in converters:
                    row[position] = converter(row[position], expression, connection)
        tenant = Tenant.from_db(connection.alias, read.attnames, row[:fields])
        tenants.append(tenant)
        caps[tenant.pk] = row[fields]
    return {"tenants": tenants, "member_caps": caps}


# The reads of every single submission, compiled from the ORM once per process rather than on each
# request (0.2-0.4 ms of CPU each, of a submission's 4): they follow the models all the same.
def _compiled(queryset, params: tuple) -> str:
    sql, compiled_params = queryset.query.sql_with_params()
    assert compiled_params == params, compiled_params
    return sql


@dataclass(frozen=True)
class _CompiledRead:
    sql: str  # its one parameter: the submitter's id
    attnames: tuple[str, ...]  # the Tenant columns, first; the member's cap follows
    converters: tuple  # ((position, (converters, expression)), ...): what the ORM applies to a row


@functools.cache
def _memberships_read() -> _CompiledRead:
    # Rows built with Model.from_db, as the ORM's own iterator builds them: a raw() queryset spent
    # another 0.1-0.2 ms a request matching its columns to the model's fields.
    queryset = Tenant.objects.filter(memberships__user_id=0).annotate(member_max_gpus=F("memberships__max_gpus"))
    compiler = queryset.order_by().query.get_compiler(DEFAULT_DB_ALIAS)
    sql, params = compiler.as_sql()
    assert params == (0,), params
    selected = [expression for expression, _, _ in compiler.select]
    attnames = [column.target.attname for column in selected[:-1]]
    assert attnames == [field.attname for field in Tenant._meta.concrete_fields], attnames
    assert compiler.select[-1][2] == "member_max_gpus", compiler.select
    return _CompiledRead(sql=sql, attnames=tuple(attnames), converters=tuple(compiler.get_converters(selected).items()))


@functools.cache
def _waiting_sql() -> str:
    ids = _compiled(Job.objects.filter(owner_id=0, state=JobState.PENDING).order_by().values("pk"),
                    (0, JobState.PENDING))
    return f"SELECT count(*) FROM ({ids}) waiting"


class TooManyWaiting(Exception):
    """The submitter already has as many jobs waiting as one user may; the message says so."""


def make_room(owner, adding: int) -> None:
    """Refuse what would put more than ``COLONY_MAX_PENDING_PER_USER`` of ``owner``'s jobs in the
    queue: one array or bulk request makes a thousand rows, and a queue a user can grow without
    bound is a database (and a scheduler cycle) anyone can fill."""
    limit = settings.COLONY_MAX_PENDING_PER_USER
    with connection.cursor() as cursor:
        cursor.execute(_waiting_sql(), [owner.pk, JobState.PENDING])
        waiting = cursor.fetchone()[0]
    if waiting + adding > limit:
        raise TooManyWaiting(
            f"You have {waiting} jobs waiting; at most {limit} may wait at once (COLONY_MAX_PENDING_PER_USER), "
            f"so {adding} more cannot be queued. Cancel some, or submit when they have started.")


@transaction.atomic
def submit_job(*, owner, tenant: Tenant, name: str, command: list[str], gpus: int, after_ok=(), after_any=(),
               **spec) -> Job:
    """Create a pending job; ``spec`` holds the optional Job fields (gpu_milli, gpu_memory_mib,
    gpu_models, mig_profile, accepts_unfenced, priority, opportunistic_only, shareable, max_nodes,
    max_runtime_s, profile_key, workdir, code, image, venv, conda, preempt_grace_s, stop_signal,
    checkpoints), checked by the caller (``JobSubmitSerializer``: a MIG profile only with one whole
    GPU, and one some online node has). ``after_ok`` and ``after_any``: ids of jobs (checked by the
    caller) it waits for."""
    make_room(owner, 1)
    job = Job.objects.create(owner=owner, tenant=tenant, name=name, command=command, gpus=gpus, **spec)
    waits.none_yet([job])
    _depend(job, after_ok, after_any)
    # Its timeline so far, for callers that answer with it (it is this one step: no read back).
    job.timeline = [lifecycle.submitted(job)]
    transaction.on_commit(nudge_scheduler)
    return job


@transaction.atomic
def submit_many(*, owner, specs: list[dict]) -> list[Job]:
    """Create pending jobs from ``specs`` (each what :func:`submit_job` takes, less ``owner``; no
    arrays), all or none: multi-row inserts of the jobs, their SUBMITTED events and dependencies.
    The jobs come back in the order of ``specs``, with their ids."""
    make_room(owner, len(specs))
    jobs = Job.objects.bulk_create(
        [Job(owner=owner, **{name: value for name, value in spec.items() if name not in ("after_ok", "after_any")})
         for spec in specs],
        batch_size=BULK_INSERT_ROWS)
    waits.none_yet(jobs)
    JobDependency.objects.bulk_create(
        [JobDependency(job=job, on_id=on, kind=kind) for job, spec in zip(jobs, specs)
         for kind, field in ((JobDependency.Kind.OK, "after_ok"), (JobDependency.Kind.ANY, "after_any"))
         for on in spec.get(field) or ()],
        batch_size=BULK_INSERT_ROWS)
    by_tenant: dict[Tenant, list[Job]] = {}
    for job in jobs:
        by_tenant.setdefault(job.tenant, []).append(job)
    for tenant, theirs in by_tenant.items():
        # The words of lifecycle.submitted; submitted_many formats them, so braces are escaped.
        message = f"By {owner.get_username()} to {tenant.slug}.".replace("{", "{{").replace("}", "}}")
        lifecycle.submitted_many(theirs, message)
    transaction.on_commit(nudge_scheduler)
    return jobs


@transaction.atomic
def submit_array(*, owner, tenant: Tenant, name: str, array: ArraySpec, array_text: str, after_ok=(), after_any=(),
                 **spec) -> tuple[JobArray, list[Job]]:
    """One job per index of ``array``, each with the same spec and dependencies; the scheduler
    runs at most ``array.max_running`` of them at once."""
    make_room(owner, len(array.indices))
    group = JobArray.objects.create(tenant=tenant, owner=owner, name=name, spec=array_text, size=len(array.indices),
                                    max_running=array.max_running)
    jobs = Job.objects.bulk_create([Job(owner=owner, tenant=tenant, name=name, array=group, array_index=index, **spec)
                                    for index in array.indices])
    waits.none_yet(jobs)
    for job in jobs:
        _depend(job, after_ok, after_any)
    lifecycle.submitted_many(jobs, f"By {owner.get_username()} to {tenant.slug}, as index {{index}} of array "
                                   f"{group.pk} ({array_text}).")
    transaction.on_commit(nudge_scheduler)
    return group, jobs


def _depend(job: Job, after_ok, after_any) -> None:
    JobDependency.objects.bulk_create(
        [JobDependency(job=job, on_id=on, kind=JobDependency.Kind.OK) for on in after_ok]
        + [JobDependency(job=job, on_id=on, kind=JobDependency.Kind.ANY) for on in after_any])


NotCancellable = lifecycle.NotAllowed
NotRequeueable = lifecycle.NotAllowed


def cancel_job(job: Job) -> Job:
    """Pending jobs end at once; placed or running ones are stopped on their node first."""
    try:
        lifecycle.begin_cancel(job.pk)
    finally:
        job.refresh_from_db()
    return job


def requeue_job(job: Job, by: str) -> Job:
    """An operator sends a placed or running job back to the queue: its processes are stopped
    (as for a preemption) and it waits for its next placement with its place in the queue kept."""
    try:
        lifecycle.begin_requeue(job.pk, by)
    finally:
        job.refresh_from_db()
    return job
