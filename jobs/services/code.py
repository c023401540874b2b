"""Researchers' code: archives ``colony submit`` uploads, and getting one to the nodes that run it.

An archive is a gzipped tar of a code directory, stored once per tenant and content (sha256) in
the database, so resubmitting the same tree uploads nothing new and a job can be retried a week
later. It is checked here as well as on the node: only regular files and directories with
relative names, bounded in count and unpacked size. A node gets it through Redis, the only channel
agents have: before a launch names it, the archive is staged (:func:`stage`) as a list of chunks
under a key only that node's Redis user may read, written in one MULTI so a node never sees half.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef, Q, Sum
from django.utils import timezone

from agents import protocol
from jobs.choices import TERMINAL_STATES
from jobs.models import CodeArchive, Job, Tenant

MAX_BYTES = protocol.CODE_MAX_BYTES
MAX_FILES = 20_000
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
# Staged copies outlive any launch re-send; a later attempt stages again if it expired.
STAGE_TTL_S = 6 * 3600


class BadArchive(ValueError):
    """Not an archive Colony runs; the message says why in one line."""


@dataclass(frozen=True)
class Contents:
    files: int
    unpacked_size: int


def inspect(data: bytes) -> Contents:
    """Check an uploaded archive without unpacking it; raises :class:`BadArchive`."""
    if not data:
        raise BadArchive("The archive is empty.")
    files = unpacked = 0
    stream = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(data)), MAX_UNPACKED_BYTES + _HEADROOM)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_FILES:
                    raise BadArchive(f"The archive has more than {MAX_FILES} entries; ignore what the job "
                                     "does not need (.colonyignore).")
                _check_member(member)
                if member.isfile():
                    files += 1
                    unpacked += member.size
                    if unpacked > MAX_UNPACKED_BYTES:
                        raise _too_big()
    except (tarfile.TarError, EOFError, OSError, zlib.error, gzip.BadGzipFile) as exc:
        raise BadArchive(f"Not a gzipped tar archive ({exc}).") from None
    return Contents(files=files, unpacked_size=unpacked)


# Tar headers, padding and pax records on top of the files' own bytes.
_HEADROOM = 16 * 1024 * 1024


def _too_big() -> BadArchive:
    return BadArchive(f"The archive unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB; "
                      "ignore data and checkpoints (.colonyignore).")


class _Bounded:
    """A decompressed stream that refuses to give more than ``limit`` bytes in all. tarfile reads a
    pax header whole, whatever size it claims: a few KiB of gzip can claim gigabytes."""

    def __init__(self, inner, limit: int):
        self.inner, self.left = inner, limit

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.left:
            size = self.left + 1
        chunk = self.inner.read(size)
        self.left -= len(chunk)
        if self.left < 0:
            raise _too_big()
        return chunk


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if not (member.isfile() or member.isdir()):
        raise BadArchive(f"{name!r} is not a regular file or directory (links and devices are not allowed).")
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "\x00" in name or len(name) > 1024:
        raise BadArchive(f"{name!r} is not a relative path inside the archive.")


class OverQuota(BadArchive):
    """The tenant keeps as much code as it may; old archives make room as they expire."""


def store(tenant: Tenant, user, data: bytes) -> tuple[CodeArchive, bool]:
    """Keep ``data`` for ``tenant``; returns (archive, created). Raises :class:`BadArchive` (and
    :class:`OverQuota` past the tenant's ``COLONY_CODE_STORAGE_MB``)."""
    if len(data) > MAX_BYTES:
        raise BadArchive(f"The archive has {len(data)} bytes; the most is {MAX_BYTES >> 20} MiB.")
    sha256 = hashlib.sha256(data).hexdigest()
    existing = CodeArchive.objects.filter(tenant=tenant, sha256=sha256).defer("data").first()
    if existing is not None and existing.purged_at is None:
        return existing, False
    contents = inspect(data)
    _check_quota(tenant, len(data))
    if existing is not None:  # purged: the same content again brings its bytes back
        CodeArchive.objects.filter(pk=existing.pk).update(data=data, purged_at=None)
        existing.purged_at = None
        return existing, False
    try:
        with transaction.atomic():
            archive = CodeArchive.objects.create(tenant=tenant, uploaded_by=user, sha256=sha256, size=len(data),
                                                 files=contents.files, unpacked_size=contents.unpacked_size,
                                                 data=data)
    except IntegrityError:  # the same upload, twice at once
        return CodeArchive.objects.defer("data").get(tenant=tenant, sha256=sha256), False
    return archive, True


def _check_quota(tenant: Tenant, adding: int) -> None:
    # Stored code is the one thing a tenant can grow without running anything: bound it.
    limit = settings.COLONY_CODE_STORAGE_MB << 20
    kept = CodeArchive.objects.filter(tenant=tenant, purged_at__isnull=True).aggregate(n=Sum("size"))["n"] or 0
    if kept + adding > limit:
        raise OverQuota(
            f"Tenant {tenant.slug} keeps {kept / 2**20:.1f} MiB of uploaded code; the most is {limit >> 20} MiB "
            f"(COLONY_CODE_STORAGE_MB). Archives no job has needed for {settings.COLONY_CODE_RETENTION_DAYS} days "
            "are dropped; a smaller upload (.colonyignore) or --workdir on a shared filesystem avoids it.")


def purge_unused(now: datetime | None = None) -> int:
    """Drop the bytes of archives no job needs: none waiting or running with it, and none finished
    with it in the last ``COLONY_CODE_RETENTION_DAYS`` (uploaded and never used: after a day).
    The row stays, so old jobs still name their code. Returns how many were purged."""
    now = now or timezone.now()
    keep_after = now - timedelta(days=settings.COLONY_CODE_RETENTION_DAYS)
    live = Job.objects.filter(code=OuterRef("pk")).exclude(state__in=TERMINAL_STATES)
    stale = (CodeArchive.objects.filter(purged_at__isnull=True)
             .annotate(busy=Exists(live), last=Max("jobs__finished_at"))
             .filter(busy=False)
             .filter(Q(last__lt=keep_after) | Q(last__isnull=True, created_at__lt=now - timedelta(days=1))))
    return CodeArchive.objects.filter(pk__in=list(stale.values_list("pk", flat=True))).update(data=b"", purged_at=now)


def chunk_count(size: int) -> int:
    return -(-size // protocol.CODE_CHUNK_BYTES)


def ref(archive: CodeArchive) -> protocol.CodeRef:
    return protocol.CodeRef(sha256=archive.sha256, size=archive.size, chunks=chunk_count(archive.size))


def stage(client: redis.Redis, node: str, archive_id: int) -> protocol.CodeRef:
    """Make the archive readable by ``node``'s agent (again, if its copy expired); returns what a
    launch names. Idempotent: an attempt re-sent or a gang's second launch reuses the copy."""
    sha256, size = CodeArchive.objects.filter(pk=archive_id).values_list("sha256", "size").get()
    key = protocol.code_key(node, sha256)
    # Refresh the TTL first: a copy that exists now stays for the launch that is about to name it.
    if not client.expire(key, STAGE_TTL_S):
        data = bytes(CodeArchive.objects.filter(pk=archive_id).values_list("data", flat=True).get())
        step = protocol.CODE_CHUNK_BYTES
        pipe = client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.rpush(key, *[data[i:i + step] for i in range(0, len(data), step)])
        pipe.expire(key, STAGE_TTL_S)
        pipe.execute()
    return protocol.CodeRef(sha256=sha256, size=size, chunks=chunk_count(size))
