"""Live output: what each running job wrote to its ``output.log`` goes to the node's logs stream,
a bounded share of it each interval, so that output never crowds out events or samples. Nothing
is buffered while Redis is away: a live tail resumes at the newest output; the whole log stays on
the node (:mod:`agents.joblog`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from agents import protocol, signing
from agents.job_output import read_output

# Each interval, at most OUTPUT_CHUNK_BYTES of each running job's output.log and OUTPUT_NODE_BYTES
# for the whole node. A job more than OUTPUT_LAG_BYTES ahead of what was shipped is skipped to its
# newest output (a live tail, not a transfer).
OUTPUT_CHUNK_BYTES = protocol.OUTPUT_CHUNK_BYTES
OUTPUT_NODE_BYTES = 8 * OUTPUT_CHUNK_BYTES
OUTPUT_LAG_BYTES = 4 * OUTPUT_CHUNK_BYTES
# Chunks per interval for the whole node (with more running jobs, they take turns): about what
# the control plane's fan-in moves a node per round.
OUTPUT_NODE_CHUNKS = 32
# The node's logs stream holds at most about this many chunks while the control plane is not
# draining it (about 8 MiB).
OUTPUT_STREAM_MAXLEN = 1000


@dataclasses.dataclass
class _OutputCursor:
    """How far a job's output.log has been shipped (see :func:`agents.job_output.read_output`)."""

    launch_id: str | None
    offset: int = 0
    anchor: bytes = b""
    shipped_at: float = 0.0  # monotonic; the longest-waiting job goes first when the node's budget is short
    ended: bool = False  # the job is gone: its last output was read once, then the cursor goes


class OutputShipper:
    """The shipped position of each job's output on one node."""

    def __init__(self, node: str, key: bytes | None):
        self._node, self._key = node, key
        self._cursors: dict[int, _OutputCursor] = {}  # job id -> how far its output was shipped
        self.shipped_bytes = 0

    def ship(self, client, launches: dict[int, str], job_dir: Callable[[int], Path], now: float) -> None:
        """Send what each running job (``launches``: job id -> launch id) wrote since the last call
        (one signed JobOutput per job, at most OUTPUT_CHUNK_BYTES; OUTPUT_NODE_BYTES in all), and
        the last of the jobs that ended since."""
        cursors = self._cursors
        for job_id in list(cursors):
            if cursors[job_id].ended:
                del cursors[job_id]  # its last output was read the time before
        budget = OUTPUT_NODE_BYTES
        entries = []
        order = sorted(set(launches) | set(cursors),
                       key=lambda job: cursors[job].shipped_at if job in cursors else 0.0)
        for job_id in order:
            if budget <= 0 or len(entries) >= OUTPUT_NODE_CHUNKS:
                break
            launch_id = launches.get(job_id)
            cursor = cursors.get(job_id)
            if launch_id is not None and (cursor is None or cursor.launch_id != launch_id):
                cursor = cursors[job_id] = _OutputCursor(launch_id)  # a new attempt: from its start
            cursor.ended = launch_id is None
            chunk = read_output(job_dir(job_id) / "output.log", cursor.offset, cursor.anchor,
                                min(OUTPUT_CHUNK_BYTES, budget), OUTPUT_LAG_BYTES)
            if chunk is None or not chunk.data:
                continue
            message = protocol.JobOutput(
                node=self._node, job_id=job_id, launch_id=cursor.launch_id,
                offset=chunk.offset, length=len(chunk.data), gap=chunk.gap,
                data=chunk.data.decode("utf-8", errors="replace"),
            )
            entries.append((cursor, chunk, signing.signed(protocol.encode(message), self._key)))
            budget -= len(chunk.data)
        if not entries:
            return
        pipe = client.pipeline(transaction=False)
        for _cursor, _chunk, fields in entries:
            pipe.xadd(protocol.node_logs_stream(self._node), fields, maxlen=OUTPUT_STREAM_MAXLEN, approximate=True)
        pipe.execute()
        for cursor, chunk, _fields in entries:  # advanced only once Redis has the chunk
            cursor.offset, cursor.anchor, cursor.shipped_at = chunk.offset + len(chunk.data), chunk.anchor, now
            self.shipped_bytes += len(chunk.data)
