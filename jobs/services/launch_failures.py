"""A launch that could not start on its node: tried on another node when the cause is that node's,
failed at once when it would fail anywhere.

The agent reports a start failure as ``JobExited(exit_code=None, error=...)``: the process never
ran. Most such causes belong to the node, not to the job: no account for its user there, a
working directory that node lacks, a cgroup it could not make, no container runtime, an
interpreter named by bare name (``cannot start 'python': No such file or directory``: found on
``PATH``, so another node may well have it). Failing the job for those made the user resubmit and
hope. So :func:`retry_elsewhere` (called by :func:`jobs.services.lifecycle.finish`, the one place
exits are settled) puts the job back in the queue with that node avoided for
``COLONY_LAUNCH_AVOID_S`` (:mod:`jobs.services.avoided_nodes`), up to
``COLONY_LAUNCH_MAX_NODES`` nodes (3); after that it fails, its error listing every node's reason.

What fails anywhere fails at once, as before (:func:`fails_anywhere`): the user's own code or
request is at fault, and another node would only say the same. Judged from the agent's words:
a program named by a path relative to the job's code (``./train.sh``) that is missing or not
executable, a NUL byte in argv or env, an environment that sets names no node allows, a code
archive that does not unpack. When in doubt the node is blamed: a retry costs seconds, a job
failed for its node's fault costs the user a resubmission.

Each retry is one ``REQUEUED`` entry on the job's timeline beginning with :data:`RETRY_WORDS` and
naming the node: what bounds the retries, and the reasons the final error lists, survive a
restart of any process and of Redis.
"""

from __future__ import annotations

import dataclasses
import logging
import re

from django.conf import settings
from django.db import transaction

from jobs.choices import JobEventKind
from jobs.models import JobEvent
from jobs.scheduling import reasons
from jobs.services import avoided_nodes
from monitoring.services.redis_client import get_redis

log = logging.getLogger(__name__)

RETRY_WORDS = "Could not start on node "
# ``cannot start 'PROGRAM': WHY`` is the supervisor's wording for an exec that failed.
_EXEC = re.compile(r"cannot start '(?P<program>[^']*)': (?P<why>.*)", re.DOTALL)
_ANYWHERE = (
    "embedded null byte",  # argv or env the user gave
    "which would change who the job is",  # env names no node allows by default
)
# The archive the user uploaded does not unpack (one not fetched to that node is the node's).
_ANYWHERE_FIRST_WORDS = ("code archive ",)


def is_start_failure(exit) -> bool:
    """The process never ran: the agent could not start it (not a stop, nor a requeue)."""
    return exit.exit_code is None and bool(exit.error) and not (exit.requeue or exit.absent or exit.stopped)


def fails_anywhere(error: str) -> bool:
    """Whether another node would refuse this launch the same way (see the module docstring)."""
    if any(words in error for words in _ANYWHERE) or error.startswith(_ANYWHERE_FIRST_WORDS):
        return True
    match = _EXEC.search(error)
    if match is None:
        return False
    program = match["program"]
    # A bare name is looked up on the node's PATH, an absolute path is the node's software: both
    # may exist elsewhere. A relative path with a slash is the job's own file.
    return "/" in program and not program.startswith("/")


# Start failures blamed on each node, a Redis hash of counters read by /metrics.
FLAGGED_KEY = "colony:launch_failures"


def retry_elsewhere(job_id: int, exit, requeue_now):
    """Settle a start failure of ``job_id`` on ``exit.node``. None: the job went back to the
    queue, that node avoided. Else the exit to fail it with (its error lists the nodes tried).
    ``requeue_now``: the lifecycle's, which alone moves the job (it calls this, so it passes it)."""
    tried = list(JobEvent.objects.filter(job_id=job_id, kind=JobEventKind.REQUEUED,
                                         message__startswith=RETRY_WORDS).order_by("id")
                 .values_list("message", flat=True))
    error = exit.error.strip()
    if fails_anywhere(error):
        return exit
    # The node is flagged (colony_node_launch_failures_total, alert ColonyNodeLaunchFailures):
    # jobs go elsewhere, but someone should see why this one refuses them.
    node = exit.node
    transaction.on_commit(lambda: get_redis().hincrby(FLAGGED_KEY, node, 1))
    if len(tried) + 1 >= settings.COLONY_LAUNCH_MAX_NODES:
        earlier = "; ".join(message[len(RETRY_WORDS):].split(". Trying")[0] for message in tried)
        summary = f"could not start on {len(tried) + 1} nodes: {earlier}; {exit.node}: {error}" if tried else error
        return dataclasses.replace(exit, error=summary[:2000])
    requeued = requeue_now([job_id], reasons.launch_failed_on_node(exit.node, error))
    if not requeued:
        return exit
    seconds = settings.COLONY_LAUNCH_AVOID_S
    transaction.on_commit(lambda: avoided_nodes.avoid(get_redis(), job_id, exit.node, seconds))
    log.warning("job %s could not start on %s (%s); requeued to try another node", job_id, exit.node, error[:200])
    return None
