"""The scheduling cycle runs in one long-lived process per deployment: its task is routed to the
`scheduler` queue, which only a one-process (solo) worker consumes, in the devstack, the compose
stack (tests/deploy/test_compose.py) and the e2e stack. So what a cycle keeps for the next survives,
and the lease does not pass between a worker's pool children (a new epoch with no failover)."""

from pathlib import Path

from django.conf import settings

from cluster_ui.celery import app
from cluster_ui.devstack.supervisor import QUIET_WORKER, SCHEDULER_QUEUE, celery_commands
from tests.e2e.conftest import WORKER_ARGV


def queue_of(task: str) -> str:
    queue = app.amqp.router.route({}, task)["queue"]
    return getattr(queue, "name", queue)


def option(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name:
            return argv[index + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def test_the_scheduling_task_goes_to_the_scheduler_queue_and_nothing_else_does():
    assert settings.COLONY_SCHEDULER_QUEUE == SCHEDULER_QUEUE == "scheduler"
    assert queue_of("jobs.tasks.scheduling_cycle") == "scheduler"
    assert settings.CELERY_BEAT_SCHEDULE["scheduling-cycle"]["task"] == "jobs.tasks.scheduling_cycle"
    for task in ("jobs.tasks.consume_agent_events", "jobs.tasks.check_node_health", "jobs.tasks.send_notification"):
        assert queue_of(task) == app.conf.task_default_queue == "celery", task


def test_the_devstack_runs_one_solo_scheduler_and_a_general_worker_without_its_queue():
    commands = dict(celery_commands("python"))
    scheduler, worker = commands["scheduler"], commands["worker"]
    assert scheduler[scheduler.index("-A") + 2] == "worker"
    assert option(scheduler, "--pool") == "solo" and option(scheduler, "-Q") == "scheduler"
    assert option(worker, "-Q") == "celery"  # a prefork worker must never take a cycle
    assert sum(1 for argv in commands.values() if "scheduler" in (option(argv, "-Q") or "").split(",")) == 1
    assert commands["beat"][commands["beat"].index("-A") + 2] == "beat"


def test_the_e2e_worker_is_one_process_that_consumes_the_scheduler_queue():
    assert option(WORKER_ARGV, "--pool") == "solo"
    assert set(option(WORKER_ARGV, "-Q").split(",")) == {"celery", "scheduler"}


def test_every_worker_runs_without_the_chatter_a_redis_restart_trips_on():
    """Mingle, gossip and worker heartbeats off in the devstack, the e2e stack and compose alike
    (``QUIET_WORKER``: a devstack worker that had them stopped taking tasks after Redis restarted)."""
    import yaml

    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    workers = {name: argv for name, argv in celery_commands("python") if "worker" in argv}
    workers.update({f"compose {name}": compose["services"][name]["command"] for name in ("worker", "scheduler")})
    workers["e2e"] = WORKER_ARGV
    assert len(workers) == 5
    for name, argv in workers.items():
        assert set(QUIET_WORKER) <= set(argv), name
