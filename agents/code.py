"""A job's uploaded code: fetch the archive the control plane staged in Redis, unpack it safely.

The control plane RPUSHes a gzipped tar, in chunks, under :func:`agents.protocol.code_key` before
it sends the launch; :func:`fetch` reads it (the agent holds the Redis client: the runner has
none) and checks its size and SHA-256 against the launch's :class:`~agents.protocol.CodeRef`.
:func:`unpack` turns the bytes into a directory the job starts in.

The archive is the user's, so it is untrusted input to a process that usually runs as root. Only
regular files and directories are unpacked: no absolute names, no ``..``, no links of either
kind, no devices or fifos; the member count and the unpacked bytes are bounded, and so is the
decompressed stream itself (a pax header may claim any size). Our checks run first and tarfile's
``data`` filter runs as well, so a gap in either is covered by the other. The tree is built in a
fresh temporary directory, handed to the job's account (``lchown``: nothing is followed) and only
then renamed into place, so a directory that exists is complete.

No Redis client is made here and no protocol I/O happens here; no Django either.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from agents.protocol import CODE_CHUNK_BYTES, CodeRef, code_key

MAX_UNPACKED_BYTES = 256 * 1024 * 1024
MAX_MEMBERS = 20_000
# Headers, padding and pax records around the members' own bytes: a tar of MAX_MEMBERS small
# files is well under this much more than its contents.
_STREAM_OVERHEAD_BYTES = MAX_MEMBERS * 2048 + 1024 * 1024


class CodeError(ValueError):
    """The archive cannot be used; the message says why, for the user."""


def code_dir_name(ref: CodeRef) -> str:
    return f"code-{ref.sha256[:12]}"


def fetch(client, node: str, ref: CodeRef) -> bytes:
    """The archive's bytes from Redis (``client`` is a redis-py client), checked against ``ref``.

    Raises :class:`CodeError` when the key is missing (never uploaded, or expired), holds the
    wrong number or size of chunks, or the bytes do not hash to ``ref.sha256``. Redis errors
    propagate: they are the connection's fault, not the archive's.
    """
    key = code_key(node, ref.sha256)
    short = ref.sha256[:12]
    count = client.llen(key)
    if count == 0:
        raise CodeError(f"code archive {short} is not staged for node {node} (it expired or was never uploaded); "
                        "submit the job again")
    if count != ref.chunks:
        raise CodeError(f"code archive {short} has {count} chunk(s) on node {node}'s key, the launch says {ref.chunks}")
    chunks = client.lrange(key, 0, ref.chunks - 1)
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        if len(chunk) > CODE_CHUNK_BYTES:
            raise CodeError(f"code archive {short} has a chunk of {len(chunk)} bytes (at most {CODE_CHUNK_BYTES})")
        size += len(chunk)
        digest.update(chunk)
    if size != ref.size:
        raise CodeError(f"code archive {short} is {size} bytes, the launch says {ref.size}")
    if digest.hexdigest() != ref.sha256:
        raise CodeError(f"code archive {short} does not match its SHA-256 (corrupted or replaced)")
    return b"".join(chunks)


def unpack(archive: bytes, target: Path, owner: tuple[int, int] | None = None) -> Path:
    """Unpack the gzipped tar ``archive`` into the new directory ``target`` (mode 700), owned by
    ``owner`` (uid, gid) when given. An existing ``target`` is kept as it is (an earlier attempt
    of the job unpacked it, and the job may have written checkpoints there since).

    Raises :class:`CodeError` naming the first member refused, or why the archive is unreadable.
    """
    if target.is_dir() and not target.is_symlink():
        return target
    partial = target.with_name(f".{target.name}.partial")
    if partial.is_symlink() or partial.is_file():
        partial.unlink()
    elif partial.exists():
        shutil.rmtree(partial)  # a crash mid-unpack; rmtree never follows links
    partial.mkdir(mode=0o700)
    try:
        _extract(archive, partial)
        if owner is not None:
            _chown_tree(partial, *owner)
        os.chmod(partial, 0o700)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def _extract(archive: bytes, into: Path) -> None:
    stream = _Bounded(gzip.GzipFile(fileobj=io.BytesIO(archive)), MAX_UNPACKED_BYTES + _STREAM_OVERHEAD_BYTES)
    members = unpacked = 0
    try:
        # Stream mode: one pass, each member checked before it is written, nothing held whole.
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                members += 1
                if members > MAX_MEMBERS:
                    raise CodeError(f"the code archive has more than {MAX_MEMBERS} entries")
                _check_member(member)
                unpacked += member.size if member.isreg() else 0
                if unpacked > MAX_UNPACKED_BYTES:
                    raise CodeError(f"the code archive unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MiB")
                tar.extract(member, into, set_attrs=True, filter="data")
    except CodeError:
        raise
    except tarfile.FilterError as exc:
        raise CodeError(f"unsafe entry in the code archive: {exc}") from None
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile, ValueError) as exc:
        raise CodeError(f"the code archive is not a readable gzipped tar: {exc}") from None
    if members == 0:
        raise CodeError("the code archive is empty")


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if not (member.isreg() or member.isdir()):
        kind = ("a symlink" if member.issym() else "a hard link" if member.islnk() else
                "a device" if member.isdev() else "a fifo" if member.isfifo() else "not a file or directory")
        raise CodeError(f"code archive entry {name!r} is {kind}; only files and directories are unpacked")
    if "\x00" in name or name.startswith("/") or PurePosixPath(name).is_absolute():
        raise CodeError(f"code archive entry {name!r} has an absolute name")
    if ".." in PurePosixPath(name).parts or ".." in name.split("\\"):
        raise CodeError(f"code archive entry {name!r} climbs out of its directory ('..')")
    if member.size < 0:
        raise CodeError(f"code archive entry {name!r} has a negative size")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


class _Bounded(io.RawIOBase):
    """A reader that fails once more than ``limit`` bytes were read: a small archive that
    decompresses to gigabytes (or a pax header claiming them) stops here."""

    def __init__(self, inner, limit: int):
        self._inner, self._left = inner, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._inner.read(min(len(buffer), self._left + 1))
        if len(data) > self._left:
            raise CodeError(f"the code archive decompresses to more than {MAX_UNPACKED_BYTES // 2**20} MiB of tar")
        self._left -= len(data)
        buffer[:len(data)] = data
        return len(data)
