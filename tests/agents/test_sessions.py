"""Interactive sessions on a real agent: a launch marked interactive runs on a pseudo-terminal; the
keystrokes the control plane MACs for the node reach it, its output comes back on the job's own
session stream, signed, and ``exit N`` ends the job with N like a batch job. Anything else on the
input stream is refused and counted, never fatal; a session left without input ends by itself."""

from __future__ import annotations

import base64
import subprocess

from agents import protocol, sessions, signing

from .helpers import events, launch, send_signed, wait_for

KEY = b"k" * 32


def interactive(job_id: int, idle_s: int = 600, argv=("sh", "-i")) -> protocol.LaunchJob:
    return launch(list(argv), job_id=job_id, command_id=f"launch-{job_id}-0",
                  env={protocol.SESSION_IDLE_ENV: str(idle_s), "PS1": "$ "}, attempt=0)


def type_in(client, node: str, job_id: int, text: bytes = b"", key: bytes = KEY, **fields) -> None:
    message = protocol.SessionInput(node=node, job_id=job_id, launch_id=f"launch-{job_id}-0",
                                    data=base64.b64encode(text).decode(), **fields)
    client.xadd(protocol.session_input_stream(node), sessions.signed_input(protocol.encode(message), key))


def screen(client, node: str, job_id: int) -> tuple[str, list[protocol.SessionOutput]]:
    entries = client.xrange(protocol.session_output_stream(node, job_id))
    for _id, fields in entries:
        assert signing.verify(KEY, fields[b"m"], fields[b"sig"])
    chunks = [protocol.decode_session_output(fields) for _id, fields in entries]
    return b"".join(base64.b64decode(chunk.data) for chunk in chunks).decode(errors="replace"), chunks


def exit_of(client, job_id: int):
    return next((e for e in events(client, "job_exited") if e.job_id == job_id), None)


def test_a_session_echoes_what_is_typed_and_ends_with_the_shells_exit(redis_url, redis_client, start_agent):
    running = start_agent(redis_url, key=KEY)
    send_signed(redis_client, "n1", interactive(701), KEY)
    wait_for(lambda: running.agent.sessions.relayed_bytes or type_in(redis_client, "n1", 701, rows=40, cols=100)
             or None, timeout=15, interval=0.3)
    type_in(redis_client, "n1", 701, b"echo hello-$((6*7)) $(stty size)\n")
    wait_for(lambda: "hello-42 40 100" in screen(redis_client, "n1", 701)[0], timeout=10)
    type_in(redis_client, "n1", 701, b"exit 3\n")
    exited = wait_for(lambda: exit_of(redis_client, 701), timeout=10)
    assert exited.exit_code == 3 and not exited.stopped

    def ended():
        text, chunks = screen(redis_client, "n1", 701)
        return (text, chunks) if chunks and chunks[-1].eof else None

    text, chunks = wait_for(ended, timeout=5)
    assert "exit 3" in text and chunks[-1].launch_id == "launch-701-0"
    # Nobody attached through the control plane (which renews it on reads): it expires all the same.
    assert 0 < redis_client.ttl(protocol.session_output_stream("n1", 701)) <= sessions.OUTPUT_KEPT_S
    assert "hello-42" in exited.output_tail  # kept like a batch job's output


def test_garbage_on_the_input_stream_is_refused_and_the_session_goes_on(redis_url, redis_client, start_agent):
    running = start_agent(redis_url, key=KEY)
    send_signed(redis_client, "n1", interactive(702), KEY)
    wait_for(lambda: running.agent.sessions.relayed_bytes or type_in(redis_client, "n1", 702, rows=24, cols=80)
             or None, timeout=15, interval=0.3)
    relayed = running.agent.sessions.relayed_bytes
    stream = protocol.session_input_stream("n1")
    redis_client.xadd(stream, {"m": b"\xff\x00 not json"})
    redis_client.xadd(stream, {"junk": "1"})
    unsigned = protocol.SessionInput(node="n1", job_id=702, launch_id="launch-702-0", data="aWQK")
    redis_client.xadd(stream, protocol.encode(unsigned))  # typed by someone without the node's key
    type_in(redis_client, "n1", 702, b"id\n", key=b"x" * 32)  # a wrong key
    other = protocol.SessionInput(node="n2", job_id=702, launch_id="launch-702-0", data="aWQK")
    redis_client.xadd(stream, sessions.signed_input(protocol.encode(other), KEY))  # for another node
    type_in(redis_client, "n1", 999, b"id\n")  # no such session here
    redis_client.xadd(stream, {"m": '{"v":1,"kind":"session_input","job_id":702,"launch_id":"launch-702-0",'
                                    '"node":"n1","data":"' + "A" * 10_000 + '"}'})
    wait_for(lambda: running.agent.sessions.refused >= 7, timeout=10)
    assert running.agent.sessions.relayed_bytes == relayed
    type_in(redis_client, "n1", 702, b"echo still-$((40+2))\n")
    wait_for(lambda: "still-42" in screen(redis_client, "n1", 702)[0], timeout=10)
    assert running.thread.is_alive()
    type_in(redis_client, "n1", 702, b"exit 0\n")
    assert wait_for(lambda: exit_of(redis_client, 702), timeout=10).exit_code == 0


def test_a_session_without_input_ends_after_its_idle_timeout(tmp_path):
    fifo = sessions.prepare_input(tmp_path, None)
    with open(tmp_path / "output.log", "wb") as log:
        host = subprocess.Popen(sessions.host_command(fifo, 1, ["sh", "-i"]), stdout=log, stderr=log,
                                env={"PATH": "/usr/bin:/bin", "PS1": "$ "})
    assert host.wait(15) == 129  # SIGHUP, as a closed terminal ends a shell
    assert "[colony] no input for 1 s: the session ends" in (tmp_path / "output.log").read_text()


def test_frames_survive_any_split_and_garbage_is_dropped():
    stream = b"".join(sessions.frames(b"x" * 5000, rows=30, cols=120)) + b"?junk" + b"".join(sessions.frames(b"ok"))
    reader = sessions.FrameReader()
    got = [frame for i in range(0, len(stream), 7) for frame in reader.feed(stream[i:i + 7])]
    assert got[0] == (sessions.FRAME_RESIZE, (30, 120))
    assert b"".join(payload for kind, payload in got if kind == sessions.FRAME_DATA) == b"x" * 5000
    assert reader.dropped > 0
    assert reader.feed(b"".join(sessions.frames(b"after"))) == [(sessions.FRAME_DATA, b"after")]
