"""A submission or a job's exit asks for a cycle now; a burst of them asks once per window, and
Redis is asked once per window too."""

import pytest

from jobs.services import nudge


@pytest.fixture
def cycles(monkeypatch, live_redis, redis_client):
    from jobs import tasks

    asked = []
    monkeypatch.setattr(tasks.scheduling_cycle, "apply_async", lambda *args, **kwargs: asked.append(1))
    monkeypatch.setattr(nudge, "_set_at", float("-inf"))
    redis_client.delete(nudge.NUDGE_KEY)
    return asked


def count_sets(monkeypatch):
    from monitoring.services import redis_client as clients

    sets = []
    real = clients.get_redis

    def counting():
        client = real()
        original = client.set

        def set_(*args, **kwargs):
            sets.append(args[0])
            return original(*args, **kwargs)

        client.set = set_
        return client

    monkeypatch.setattr(nudge, "get_redis", counting)
    return sets


def test_a_burst_asks_for_one_cycle_and_redis_once(cycles, monkeypatch):
    sets = count_sets(monkeypatch)
    for _ in range(20):
        nudge.nudge_scheduler()
    assert len(cycles) == 1 and sets == [nudge.NUDGE_KEY]


def test_after_the_window_it_asks_again(cycles, monkeypatch, redis_client):
    clock = [1000.0]
    monkeypatch.setattr(nudge, "_clock", lambda: clock[0])
    nudge.nudge_scheduler()
    clock[0] += nudge.NUDGE_WINDOW_MS / 1000 + 0.01
    redis_client.delete(nudge.NUDGE_KEY)  # (expired by then)
    nudge.nudge_scheduler()
    assert len(cycles) == 2


def test_another_process_nudge_in_the_window_is_shared(cycles, redis_client):
    redis_client.set(nudge.NUDGE_KEY, 1, px=nudge.NUDGE_WINDOW_MS)  # another web process just asked
    nudge.nudge_scheduler()
    assert cycles == []
