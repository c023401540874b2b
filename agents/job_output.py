"""Reading a job's ``output.log`` (:mod:`agents.joblog` writes it): its last bytes for an exit
report (:func:`read_tail`), and what is new since the last read for the live tail the agent ships
(:func:`read_output`). Both cut at UTF-8 character boundaries. No Redis here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agents.protocol import OUTPUT_TAIL_BYTES


def read_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text (invalid UTF-8 replaced); "" if unreadable."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - limit))
            data = file.read(limit)
    except OSError:
        return ""
    if len(data) == limit:
        # The cut may land inside a multi-byte character: drop its continuation bytes rather
        # than start the tail with a replacement character.
        skip = 0
        while skip < 3 and skip < len(data) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class OutputChunk:
    """New bytes of a job's ``output.log`` (:func:`read_output`): ``data`` starts at byte
    ``offset`` of the file; ``gap`` says output before it was passed over; ``anchor`` is the last
    bytes up to ``offset + len(data)``, to tell next time whether the file was rewritten since."""

    offset: int
    data: bytes
    gap: bool
    anchor: bytes


OUTPUT_ANCHOR_BYTES = 32


def read_output(path: Path, offset: int, anchor: bytes, limit: int, lag: int) -> OutputChunk | None:
    """The bytes of ``path`` after ``offset`` (at most ``limit``, cut at a UTF-8 character
    boundary); None when the file cannot be read.

    The log is bounded (:mod:`agents.joblog`): past its cap it is rewritten in place as head,
    marker and recent output. Reading on from ``offset`` stays right as long as the ``anchor``
    (the bytes just before ``offset``) is still there, which holds while ``offset`` lies in the
    kept head; otherwise, or when more than ``lag`` bytes wait, reading resumes ``limit`` bytes
    before the end, with ``gap`` set: a live tail shows the newest output, not a backlog.
    """
    try:
        with open(path, "rb") as file:
            size = file.seek(0, os.SEEK_END)
            gap = False
            if offset > size or (anchor and _bytes_at(file, offset - len(anchor), len(anchor)) != anchor):
                offset, gap = max(0, size - limit), True  # rewritten (compacted, or a new file)
            elif size - offset > lag:
                offset, gap = size - limit, True
            file.seek(offset)
            data = file.read(limit)
    except OSError:
        return None
    if gap:
        # Started mid-file: a cut inside a character would begin with its continuation bytes.
        skip = 0
        while skip < 3 and skip < len(data) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data, offset = data[skip:], offset + skip
    data = data[:len(data) - _partial_character(data)]
    tail = (data if gap else anchor + data)[-OUTPUT_ANCHOR_BYTES:]
    return OutputChunk(offset=offset, data=data, gap=gap, anchor=tail)


def _bytes_at(file, offset: int, length: int) -> bytes:
    if offset < 0:
        return b""
    file.seek(offset)
    return file.read(length)


def _partial_character(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character that is not complete yet
    (the job may be writing it right now): those wait for the next read."""
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if need > back else 0
        return 0
    return 0
