"""Whether a job that failed ran out of GPU memory: from what the node saw, never from the job's words.

An out-of-memory verdict (``JobExited.oom``) blames the job's memory limit for its end, so it
must rest on the node's own observation: the agent killed the job for it
(:meth:`agents.runner.JobRunner.kill_out_of_memory`, from the driver's or the simulated GPU's
report), or the job failed on a GPU whose limit this node enforces after the node's samples saw
it hold (nearly) all of that limit. What the job printed proves nothing: any job can print
"CUDA out of memory". Such text, where a limit was enforced, is passed on only as a hint in the
exit's ``error`` (the job's own claim, worded as such), and the verdict stays no.

Pure functions; the agent hands in the GPUs' modes and its samples' peaks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# What CUDA frameworks print when an allocation fails (PyTorch, the CUDA runtime and driver, XLA).
ALLOCATION_FAILURE = re.compile(
    r"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError"
    r"|RESOURCE_EXHAUSTED: Out of memory")
# A job whose samples reached this share of its limit held the limit: an allocation past it is
# what fails next (the samples come every interval, so the very last bytes are rarely seen).
AT_LIMIT_SHARE = 0.95
ENFORCED_BY = {"mps": "its GPU's MPS server", "memory_limit": "the driver"}


def enforcing(modes: Mapping[int, str], gpu_indices: Sequence[int]) -> dict[int, str]:
    """GPU index -> what enforces the job's memory limit there, for the job's GPUs whose limit this
    node enforces: a driver limit, or an MPS server the job is the client of (one GPU only)."""
    indices = list(gpu_indices)
    return {i: ENFORCED_BY[modes[i]] for i in indices
            if modes.get(i) == "memory_limit" or (modes.get(i) == "mps" and len(indices) == 1)}


def observed_verdict(job_id: int, exit_code: int | None, limit_mib: int | None, enforced: Mapping[int, str],
                     peaks: Mapping[int, int], output_tail: str) -> tuple[bool, str | None]:
    """``(oom, error)`` for a job that ended on its own (not stopped, not killed by the agent).

    Out of memory only when it failed (an exit code other than 0) on a GPU in ``enforced`` where
    the node saw it hold at least :data:`AT_LIMIT_SHARE` of ``limit_mib`` (``peaks``: GPU index ->
    the most MiB a sample saw). Otherwise no verdict; an allocation failure the job printed on such
    a GPU comes back as a hint in ``error``.
    """
    if not limit_mib or exit_code in (0, None) or not enforced:
        return False, None
    index = max(enforced, key=lambda i: peaks.get(i, -1))
    held = peaks.get(index)
    if held is not None and held >= AT_LIMIT_SHARE * limit_mib:
        return True, (f"CUDA out of memory on GPU {index}: job {job_id} hit its limit of {limit_mib} MiB, "
                      f"enforced by {enforced[index]}; it held up to {held} MiB in the node's samples")
    if ALLOCATION_FAILURE.search(output_tail or ""):
        seen = f"held at most {held} MiB" if held is not None else "was not seen holding GPU memory"
        return False, (f"the job's output reports a CUDA allocation failure; in the node's samples it {seen} of "
                       f"its {limit_mib} MiB limit on GPU {index}, so the node does not count it as out of memory")
    return False, None
