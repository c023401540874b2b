"""Live output: a real agent ships new bytes of each running job's output.log on its own logs
stream, signed, a bounded chunk per job per interval, and skips to the newest output when a job
writes faster than that."""

from __future__ import annotations

import os

from agents import job_output, protocol, signing
from agents.job_output import read_output

from .helpers import launch, python, send, send_signed, stop, wait_for

KEY = b"k" * 32


def outputs(client, node="n1") -> list[protocol.JobOutput]:
    return [protocol.decode_output(fields) for _id, fields in client.xrange(protocol.node_logs_stream(node))]


def text_of(chunks) -> str:
    return "".join(chunk.data for chunk in chunks)


def test_output_of_a_running_job_is_shipped_while_it_runs(redis_url, redis_client, start_agent):
    start_agent(redis_url, key=KEY)
    code = ("import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
            "time.sleep(60)")
    cmd = launch(python(code), attempt=0)
    send_signed(redis_client, "n1", cmd, KEY)
    chunks = wait_for(lambda: outputs(redis_client) if "line 2" in text_of(outputs(redis_client)) else None,
                      timeout=15)
    assert text_of(chunks) == "line 0\nline 1\nline 2\n"  # in order, once each, while the job still runs
    assert [chunk.offset for chunk in chunks] == [sum(c.length for c in chunks[:i]) for i in range(len(chunks))]
    assert all(c.job_id == cmd.job_id and c.launch_id == cmd.command_id and not c.gap for c in chunks)
    for _id, fields in redis_client.xrange(protocol.node_logs_stream("n1")):
        assert signing.verify(KEY, fields[b"m"], fields[b"sig"])
    send_signed(redis_client, "n1", stop(cmd.job_id, grace=0.5), KEY)


def test_a_chatty_job_is_shipped_a_bounded_chunk_per_interval(redis_url, redis_client, start_agent):
    agent = start_agent(redis_url, interval=0.2).agent
    code = "import sys, time\nwhile True:\n    sys.stdout.write('x' * 65536 + '\\n')\n    sys.stdout.flush()\n"
    cmd = launch(python(code))
    send(redis_client, "n1", cmd)
    wait_for(lambda: len(outputs(redis_client)) >= 10, timeout=15)
    send(redis_client, "n1", stop(cmd.job_id, grace=0.5))
    chunks = outputs(redis_client)
    assert all(len(c.data) <= protocol.OUTPUT_CHUNK_BYTES for c in chunks)
    assert any(c.gap for c in chunks[1:])  # skipped ahead to the newest output, never a backlog
    assert all(len(fields[b"m"]) <= protocol.MAX_MESSAGE_BYTES
               for _id, fields in redis_client.xrange(protocol.node_logs_stream("n1")))
    assert agent.shipped_output_bytes <= protocol.OUTPUT_CHUNK_BYTES * (len(chunks) + 1)


def test_reading_resumes_where_it_left_and_notices_a_rewritten_log(tmp_path):
    path = tmp_path / "output.log"
    path.write_bytes(b"hello \xc3")  # a character cut in the middle: it waits for its second byte
    first = read_output(path, 0, b"", 1024, 4096)
    assert (first.offset, first.data, first.gap) == (0, b"hello ", False)
    with open(path, "ab") as file:
        file.write(b"\xa9t\xc3\xa9\n")
    second = read_output(path, len(first.data), first.anchor, 1024, 4096)
    assert second.data.decode() == "\u00e9t\u00e9\n" and not second.gap
    # Rewritten past its cap (agents/joblog.py): the bytes before the offset changed.
    path.write_bytes(b"H" * 100 + b"\n[colony: 5 bytes of output left out here]\nrecent\n")
    third = read_output(path, second.offset + len(second.data), second.anchor, 1024, 4096)
    assert third.gap and third.data.endswith(b"recent\n")


def test_a_job_far_ahead_is_read_from_its_newest_output(tmp_path):
    path = tmp_path / "output.log"
    path.write_bytes(os.urandom(10) + b"a" * 100_000)
    chunk = read_output(path, 0, b"", 1000, 4000)
    assert chunk.gap and chunk.offset == 100_010 - 1000 and chunk.data == b"a" * 1000
    assert len(chunk.anchor) == job_output.OUTPUT_ANCHOR_BYTES
