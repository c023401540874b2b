"""A job's output log that never grows past a bound.

The job writes into a pipe, not into the file: a thread of the agent copies the pipe into
``output.log``. Only that thread writes the file, so it can bound it without racing the job:
when the next chunk would take the file past ``max_bytes``, the file is rewritten in place as

    <the first max_bytes/8 of the output>
    [colony: N bytes of output left out here]
    <the most recent output, up to about max_bytes/2 in all>

and appending goes on. The job never blocks on a full log and is never killed for one; a full
disk or another write error costs the rest of the log, never the job (the pipe keeps draining).
The head keeps start-up messages, the tail the last words that ``read_tail`` reports on exit.

Nothing here knows about jobs, protocols or Redis.
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import threading
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MAX_LOG_BYTES = 16 * 1024 * 1024
MIN_MAX_LOG_BYTES = 64 * 1024  # room for a head, the marker and more than one reported tail
_CHUNK = 64 * 1024
_PIPE_BYTES = 1024 * 1024  # a roomier pipe: a slow disk stalls the job less often
_SELECT_SECONDS = 0.25  # how often an idle pump checks whether it was told to stop


class BoundedLog:
    """Copies ``read_fd`` (the read end of the job's output pipe) into ``path`` in a thread.

    The file is created (replacing any old one) by :meth:`open`, before the job starts; call
    :meth:`start` once the job holds the write end, and :meth:`finish` once the job is gone.
    """

    def __init__(self, path: Path, read_fd: int, file_fd: int, max_bytes: int, name: str):
        if max_bytes < MIN_MAX_LOG_BYTES:
            raise ValueError(f"max_bytes must be at least {MIN_MAX_LOG_BYTES}")
        self.path = path
        self.max_bytes = max_bytes
        self._read_fd = read_fd
        self._file_fd = file_fd
        self._head = max_bytes // 8
        self._size = 0  # bytes in the file
        self._total = 0  # bytes the job wrote
        self.dropped = 0  # bytes of output left out of the file so far
        self._broken = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=name, daemon=True)

    @classmethod
    def open(cls, path: Path, max_bytes: int, *, group: int | None = None, name: str = "job-output"):
        """Create the log file and the pipe; returns ``(log, write_fd)``. The caller passes
        ``write_fd`` to the child as stdout and stderr and closes it after the fork.

        ``group`` (a gid) may read the log; nobody else but the agent's user. Raises OSError.
        """
        try:
            path.unlink()  # a fresh inode: never write through whatever stood at this name
        except FileNotFoundError:
            pass
        file_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        try:
            if group is not None:
                os.fchown(file_fd, -1, group)
            read_fd, write_fd = os.pipe()  # both close-on-exec; Popen dups the write end onto 1 and 2
        except OSError:
            os.close(file_fd)
            raise
        try:
            fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except (OSError, AttributeError):
            pass  # a smaller pipe only means more back-pressure on a chatty job
        os.set_blocking(read_fd, False)
        return cls(path, read_fd, file_fd, max_bytes, name), write_fd

    def start(self) -> None:
        self._thread.start()

    def finish(self, wait: float = 1.0) -> None:
        """Wait up to ``wait`` seconds for the end of the output (every writer gone), then copy
        what is already in the pipe and stop. A process that escaped the job's group may still
        hold the pipe; it is cut off here rather than keep the agent waiting."""
        if not self._thread.is_alive() and self._thread.ident is None:
            self._close()  # never started (the job could not be launched)
            return
        self._thread.join(wait)
        self._stop.set()
        self._thread.join()

    # ------------------------------------------------------------------ the pump thread

    def _pump(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._read_fd, selectors.EVENT_READ)
        try:
            while True:
                stopping = self._stop.is_set()
                if not stopping and not selector.select(_SELECT_SECONDS):
                    continue
                if not self._drain() or stopping:
                    return
        except Exception:  # never let a bug here leave the job blocked on a full pipe silently
            log.exception("output pump of %s failed", self.path)
        finally:
            selector.close()
            self._close()

    def _drain(self) -> bool:
        """Copy what the pipe holds now; False at end of file."""
        while True:
            try:
                data = os.read(self._read_fd, _CHUNK)
            except BlockingIOError:
                return True
            if not data:
                return False
            self._append(data)

    def _append(self, data: bytes) -> None:
        self._total += len(data)
        if self._broken:
            self.dropped += len(data)
            return
        try:
            if self._size < self._head:  # the head is kept whole: fill it first
                first = data[: self._head - self._size]
                _pwrite_all(self._file_fd, first, self._size)
                self._size += len(first)
                data = data[len(first):]
            if self._size + len(data) > self.max_bytes:
                data = self._compact(data)
            _pwrite_all(self._file_fd, data, self._size)
            self._size += len(data)
        except OSError as exc:
            self._broken = True
            self.dropped = self._total - self._size
            log.error("cannot write %s (%s); the rest of this job's output is discarded", self.path, exc)

    def _compact(self, data: bytes) -> bytes:
        """Rewrite the file as head + marker + recent output; return what of ``data`` remains to
        be appended after that."""
        # Size the marker for the largest count it can show, so the kept bytes can be worked
        # out before the count is known; a smaller count is padded to the same length.
        marker_len = len(_marker(self._total))
        keep = self.max_bytes // 2 - self._head - marker_len  # recent output kept
        data = data[-keep:]
        from_file = min(keep - len(data), self._size - self._head)
        self.dropped = self._total - self._head - from_file - len(data)
        marker = _marker(self.dropped)
        marker = marker[:-1].ljust(marker_len - 1) + "\n"
        offset = self._head
        _pwrite_all(self._file_fd, marker.encode(), offset)
        offset += marker_len
        # Move the last ``from_file`` bytes down, front to back: the target lies before the
        # source, so nothing is overwritten before it is copied.
        source = self._size - from_file
        while from_file:
            chunk = os.pread(self._file_fd, min(_CHUNK * 16, from_file), source)
            if not chunk:
                break
            _pwrite_all(self._file_fd, chunk, offset)
            offset += len(chunk)
            source += len(chunk)
            from_file -= len(chunk)
        os.ftruncate(self._file_fd, offset)
        self._size = offset
        return data

    def _close(self) -> None:
        for fd in (self._read_fd, self._file_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._read_fd = self._file_fd = -1


def _marker(dropped: int) -> str:
    return f"\n[colony: {dropped} bytes of output left out here]\n"


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
