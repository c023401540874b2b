"""An agent's "I do not know that attempt" answer is not sent again once it has run the attempt.

Found by the soak (tests/e2e/test_soak.py, issue 35, seed 39): the control plane asked about a
placed attempt whose launch had been trimmed from the node's stream, and the agent answered
"absent" (true then). The re-sent launch ran. Redis was killed, and on reconnecting the agent
sent its recent exits again (``Agent._connect``), that absent answer among them: ``_publish``
kept every JobExited in ``_recent_exits``, answers included. The control plane took it for the
running attempt vanishing and ran the job a second time. Both sides now hold: the control plane
ignores an absent answer dated before the attempt's start (``jobs.services.lifecycle.finish``),
and the agent never re-sends an answer (``RecentExits.to_send_again``).
"""

from __future__ import annotations

import redis as redis_lib

from agents import protocol
from cluster_ui.devstack.redis_server import PrivateRedis

from .helpers import command, events, launch, python, send, wait_for


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def test_an_absent_answer_given_before_the_launch_is_not_replayed_after_a_redis_restart(tmp_path, start_agent):
    with PrivateRedis(tmp_path / "redis") as server:
        client = redis_lib.Redis.from_url(server.url)
        start_agent(server.url)
        # Asked before its launch arrived (the launch was trimmed; the control plane re-sends it).
        send(client, "n1", command(protocol.QueryAttempt, 701, launch_id="launch-701-1"))
        wait_for(lambda: [e for e in exited(client, 701) if e.absent])
        send(client, "n1", launch(python("print('ran')"), job_id=701, command_id="launch-701-1", attempt=1))
        wait_for(lambda: [e for e in exited(client, 701) if not e.absent])
        server.restart()  # Redis SIGKILLed and back empty: the agent re-sends its recent exits
        client = redis_lib.Redis.from_url(server.url)
        [ran] = wait_for(lambda: [e for e in exited(client, 701) if not e.absent], timeout=10)
        assert ran.exit_code == 0
        assert [e for e in exited(client, 701) if e.absent] == []  # no "not here" for an attempt that ran
        client.close()
