"""``colony cancel`` by selection against a live server: ``--array``, ``--name`` and ``--mine``
(together: all must match), shown and confirmed unless ``--yes``, cancelled in one request, and
what was cancelled, stopped or left said in words."""

from __future__ import annotations

import io
import json
import sys

import pytest

from agents import protocol
from cluster_ui.cli import main
from jobs.choices import JobState
from jobs.models import Job, JobArray
from tests.factories import GpuFactory, JobFactory, NodeFactory, running_job
from tests.cluster_ui.cli.helpers import point_at


def run(capsys, *argv, answer: str | None = None) -> tuple[int, str, str]:
    if answer is not None:
        sys.stdin = io.StringIO(answer)
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def colony(live_server, transactional_db, live_redis, monkeypatch, tmp_path, alice):
    """A live server for alice, its stop commands going to the tests' own Redis."""
    point_at(monkeypatch, tmp_path, live_server.url, alice)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    return monkeypatch


def states(*jobs) -> list[str]:
    return [Job.objects.get(pk=job.pk).state for job in jobs]


def test_cancel_by_array_name_and_mine_asks_first_and_says_what_it_did(colony, capsys, alice, bob, charlie, vision,
                                                                       redis_client):
    array = JobArray.objects.create(tenant=vision, owner=alice, name="sweep", spec="0-2", size=3)
    tasks = [JobFactory(tenant=vision, owner=alice, name="sweep", array=array, array_index=i) for i in range(3)]
    done = JobFactory(tenant=vision, owner=alice, name="sweep", array=array, array_index=3, state=JobState.SUCCEEDED)
    node = NodeFactory(name="n1")
    running = running_job(vision, alice, [GpuFactory(node=node, index=0)], name="sweep-lr-0.1")
    waiting = JobFactory(tenant=vision, owner=alice, name="sweep-lr-0.2")
    other = JobFactory(tenant=vision, owner=alice, name="train")
    teammates = JobFactory(tenant=vision, owner=bob, name="sweep-bob")
    outsiders = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie, name="sweep-charlie")

    # Declined: nothing happens.
    code, out, err = run(capsys, "cancel", "--array", str(array.pk), answer="n\n")
    assert (code, out.strip()) == (0, "Nothing cancelled.")
    assert f"3 jobs of array {array.pk}:" in err and "Cancel these 3 jobs? [y/N]" in err
    assert "sweep[2]" in err and "alice" in err
    assert states(*tasks) == [JobState.PENDING] * 3

    code, out, err = run(capsys, "cancel", "--array", str(array.pk), answer="y\n")
    assert code == 0, err
    assert out.strip() == f"Cancelled 3 jobs ({tasks[0].pk}-{tasks[2].pk})."
    assert states(*tasks, done) == [JobState.CANCELLED] * 3 + [JobState.SUCCEEDED]

    # A name pattern reaches what alice can see, her teammate's too, and says why it leaves that.
    code, out, err = run(capsys, "cancel", "--name", "sweep-*", "--yes")
    assert code == 0, err
    assert out.splitlines() == [
        f"Cancelled 1 job ({waiting.pk}).",
        f"Stopping 1 job ({running.pk}): its node was told to end it.",
        f"Left job {teammates.pk}: Only its owner (bob), a lead of tenant vision or an operator can cancel job "
        f"{teammates.pk}.",
    ]
    assert states(running, waiting, teammates, outsiders, other) == [
        JobState.CANCELLING, JobState.CANCELLED, JobState.PENDING, JobState.PENDING, JobState.PENDING]
    stops = [c for _, f in redis_client.xrange(protocol.command_stream("n1"))
             if isinstance(c := protocol.decode_command(f), protocol.StopJob)]
    assert [stop.job_id for stop in stops] == [running.pk]

    # --mine: everything of hers still to cancel; as JSON for scripts.
    code, out, _ = run(capsys, "--json", "cancel", "--mine", "--yes")
    assert json.loads(out) == {"cancelled": [other.pk], "stopping": [], "skipped": []}
    code, out, _ = run(capsys, "cancel", "--mine", "--name", "sweep-*", "--yes")
    assert (code, out.strip()) == (0, "No unfinished job named like 'sweep-*' of yours.")


def test_several_ids_go_in_one_request_without_a_question(colony, capsys, alice, vision):
    jobs = [JobFactory(tenant=vision, owner=alice) for _ in range(3)]
    code, out, _ = run(capsys, "cancel", *(str(job.pk) for job in jobs))
    assert (code, out.strip()) == (0, f"Cancelled 3 jobs ({jobs[0].pk}-{jobs[2].pk}).")


def test_a_selection_without_an_answer_cancels_nothing_and_says_how(colony, capsys, alice, vision):
    job = JobFactory(tenant=vision, owner=alice)
    code, _, err = run(capsys, "cancel", "--mine")  # stdin at its end: no terminal to ask
    assert code == 2 and "give --yes to cancel without asking" in err
    assert states(job) == [JobState.PENDING]


@pytest.mark.parametrize("argv, words", [
    (["cancel"], "say what to cancel"),
    (["cancel", "5", "--mine"], "not both"),
    (["cancel", "--name", " "], "--name takes a pattern"),
    (["cancel", "--array", "x"], "invalid int value"),
])
def test_bad_cancel_selections_are_usage_errors(capsys, monkeypatch, argv, words):
    monkeypatch.setenv("COLONY_TOKEN", "t")
    monkeypatch.setenv("COLONY_URL", "http://127.0.0.1:9/")  # never reached
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err
