"""gunicorn's settings for Colony's web server: ``gunicorn --config python:cluster_ui.gunicorn_conf``
(the image's CMD, compose's ``web``).

Workers are threaded (``gthread``, ``COLONY_WEB_THREADS`` threads each, default 8): an attached
``colony shell`` long-polls its terminal's output for up to 20 s, and a sync worker would be held
for that whole wait, so three attached sessions would stall every page on a three-worker server.

What makes /metrics right across workers lives here too: each worker is its own process with its
own prometheus_client counters, so a scrape answered by one worker would show that worker's share
of the requests. In prometheus_client's multiprocess mode every worker writes its counters and
histograms to files in ``PROMETHEUS_MULTIPROC_DIR`` and /metrics sums them
(monitoring.metrics.web_process_collectors). The variable must be in the environment before a
worker imports prometheus_client, so it is set here, in the master, before any worker forks.
"""

import glob
import os
import shutil
import tempfile

worker_class = "gthread"
threads = int(os.environ.get("COLONY_WEB_THREADS") or 8)

_OWN_DIRECTORY = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _OWN_DIRECTORY:
    # Not configured (a plain `gunicorn` outside compose): a private directory for this master.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="colony-prometheus-")


def on_starting(server):
    """Start from zero: files left by an earlier run (a restarted container keeps its /tmp) would be
    summed in, and the pids in their names may be reused by this run's workers. Only the
    ``*.db`` files prometheus_client writes are removed, never the directory someone named."""
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "*.db")):
        os.remove(stale)


def child_exit(server, worker):
    """A dead worker's counters stay (its requests happened); its live-gauge files go."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _OWN_DIRECTORY:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
