"""The notebook tunnel on a real agent (``colony jupyter``'s node half): a launch marked as a
notebook runs the job environment's ``jupyter`` on a loopback port the agent picked, with the
launch's token in its environment (never on its command line); bytes the control plane MACs for
the node reach that server over a tunnel connection and its answer comes back signed on the
connection's own stream. Garbage, forgeries and another node's or attempt's entries are dropped
and counted; a job whose environment has no jupyter fails saying so."""

from __future__ import annotations

import base64
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path

from agents import notebooks, protocol, signing, tunnel, tunnel_protocol

from .helpers import events, launch, send_signed, wait_for

KEY = b"k" * 32
TOKEN = "t" * 64
# Stands in for `jupyter lab`: serves on the port and base URL Colony names, only to its token.
FAKE_JUPYTER = f"""#!{sys.executable}
import http.server, os, sys
flags = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)
token = os.environ["JUPYTER_TOKEN"]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "token " + token
        body = (("hello " + self.path) if ok else "token required").encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = http.server.HTTPServer(("127.0.0.1", int(flags["ServerApp.port"])), Handler)
print("serving under", flags["ServerApp.base_url"], "idle", flags["ServerApp.shutdown_no_activity_timeout"],
      flush=True)
server.serve_forever()
"""


def fake_jupyter(folder: Path) -> str:
    folder.mkdir(exist_ok=True)
    (folder / "jupyter").write_text(FAKE_JUPYTER)
    (folder / "jupyter").chmod(0o755)
    return str(folder)


def notebook(job_id: int, path: str, attempt: int = 0) -> protocol.LaunchJob:
    return launch(["jupyter", "lab"], job_id=job_id, command_id=f"launch-{job_id}-{attempt}", attempt=attempt,
                  env={tunnel_protocol.NOTEBOOK_IDLE_ENV: "600", tunnel_protocol.NOTEBOOK_TOKEN_ENV: TOKEN,
                       "PATH": path})


def put(client, node: str, job_id: int, conn: str, seq: int, op: str, data: bytes = b"", key: bytes | None = KEY,
        launch_id: str | None = None, raw: dict | None = None) -> None:
    message = tunnel_protocol.TunnelInput(node=node, job_id=job_id, launch_id=launch_id or f"launch-{job_id}-0",
                                          conn=conn, seq=seq, op=op, data=base64.b64encode(data).decode())
    fields = raw or protocol.encode(message)
    client.xadd(tunnel_protocol.tunnel_input_stream(node), tunnel_protocol.signed_input(fields, key))


def answer(client, node: str, conn: str) -> tuple[bytes, list[tunnel_protocol.TunnelOutput]]:
    entries = client.xrange(tunnel_protocol.tunnel_output_stream(node, conn))
    for _id, fields in entries:
        assert signing.verify(KEY, fields[b"m"], fields[b"sig"])
    chunks = [tunnel_protocol.decode_output(fields) for _id, fields in entries]
    return b"".join(base64.b64decode(chunk.data) for chunk in chunks), chunks


def request(client, node: str, job_id: int, path: str, token: str | None = TOKEN) -> bytes:
    conn = secrets.token_hex(16)
    put(client, node, job_id, conn, 0, "open")
    auth = f"Authorization: token {token}\r\n" if token else ""
    put(client, node, job_id, conn, 1, "data", f"GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n".encode())
    return wait_for(lambda: (lambda got: got if got[1] and got[1][-1].eof else None)(answer(client, node, conn)),
                    timeout=10)[0]


def wait_until_serving(running, job_id: int) -> int:
    """The port of the job's (fake) notebook server, once it serves."""
    log = running.agent.runner.job_dir(job_id) / "output.log"
    wait_for(lambda: log.exists() and b"serving under" in log.read_bytes() and log.read_bytes().endswith(b"\n"),
             timeout=15)
    return notebooks.read_port(running.agent.runner.job_dir(job_id))


def test_a_tunnel_reaches_the_notebook_server_with_its_token(redis_url, redis_client, start_agent, tmp_path):
    running = start_agent(redis_url, key=KEY)
    send_signed(redis_client, "n1", notebook(801, fake_jupyter(tmp_path / "bin")), KEY)
    port = wait_until_serving(running, 801)
    assert b"serving under /notebooks/801/ idle 600" in (running.agent.runner.job_dir(801) / "output.log").read_bytes()

    reply = request(redis_client, "n1", 801, "/notebooks/801/lab")
    assert reply.startswith(b"HTTP/1.0 200") and reply.endswith(b"hello /notebooks/801/lab")
    # No proxy read that answer (as when one dies mid-request): its stream expires all the same.
    answers = redis_client.keys(tunnel_protocol.tunnel_output_stream("n1", "*"))
    assert answers and all(0 < redis_client.ttl(key) <= tunnel.OUTPUT_KEPT_S for key in answers)
    # Straight to its port without the token (as another job on the node would): refused.
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/notebooks/801/lab", timeout=5)
        raise AssertionError("the notebook server answered without its token")
    except urllib.error.HTTPError as exc:
        assert exc.code == 403
    # The token is in the server's environment, never on a command line anyone may read.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                assert TOKEN.encode() not in (proc / "cmdline").read_bytes()
            except OSError:
                pass


def test_garbage_and_forgeries_on_the_tunnel_input_are_dropped(redis_url, redis_client, start_agent, tmp_path):
    running = start_agent(redis_url, key=KEY)
    send_signed(redis_client, "n1", notebook(802, fake_jupyter(tmp_path / "bin")), KEY)
    relay = running.agent.tunnel
    wait_until_serving(running, 802)
    wait_for(lambda: 802 in relay._tracked, timeout=5)

    forged = [secrets.token_hex(16) for _ in range(6)]
    put(redis_client, "n1", 802, forged[0], 0, "open", key=None)  # unsigned
    put(redis_client, "n1", 802, forged[1], 0, "open", key=b"x" * 32)  # another key's MAC
    put(redis_client, "n2", 802, forged[2], 0, "open")  # on another node's stream: never read here
    redis_client.xadd(tunnel_protocol.tunnel_input_stream("n1"), tunnel_protocol.signed_input(
        protocol.encode(tunnel_protocol.TunnelInput(node="n2", job_id=802, launch_id="launch-802-0", conn=forged[2],
                                                    seq=0, op="open")), KEY))
    put(redis_client, "n1", 802, forged[3], 0, "open", launch_id="launch-802-7")  # another attempt
    put(redis_client, "n1", 802, forged[4], 0, "open", raw={"m": '{"v": 1, "kind": "tunnel", "op": "open"}'})
    redis_client.xadd(tunnel_protocol.tunnel_input_stream("n1"), {"m": b"\xff" * 40, "junk": "1"})
    put(redis_client, "n1", 802, forged[5], 3, "data", b"GET / HTTP/1.0\r\n\r\n")  # data on a conn never opened
    wait_for(lambda: relay.refused >= 7, timeout=10)
    assert relay.open_connections == 0
    # The control plane's own open for an attempt that no longer runs here is answered, so the user hears why.
    # (The relay writes what it answers after each batch it reads: counted refused first, written soon after.)
    _data, [ended] = wait_for(lambda: (lambda got: got if got[1] else None)(answer(redis_client, "n1", forged[3])),
                              timeout=10)
    assert ended.eof and "not running any more" in ended.error

    # The relay carries on: a proper connection still gets through.
    assert request(redis_client, "n1", 802, "/notebooks/802/").endswith(b"hello /notebooks/802/")
    # By then (its answer written after whatever came before it) nothing answered the forgeries.
    assert not any(redis_client.exists(tunnel_protocol.tunnel_output_stream("n1", conn))
                   for conn in forged[:3] + forged[4:])
    # Out of order: the connection ends, saying so, instead of passing on a gap.
    conn = secrets.token_hex(16)
    put(redis_client, "n1", 802, conn, 0, "open")
    put(redis_client, "n1", 802, conn, 2, "data", b"GET / HTTP/1.0\r\n\r\n")
    _data, chunks = wait_for(lambda: (lambda got: got if got[1] else None)(answer(redis_client, "n1", conn)))
    assert chunks[-1].eof and "lost" in chunks[-1].error


def test_a_notebook_job_without_jupyter_fails_saying_so(redis_url, redis_client, start_agent, tmp_path):
    start_agent(redis_url, key=KEY)
    (tmp_path / "empty").mkdir()
    send_signed(redis_client, "n1", notebook(803, str(tmp_path / "empty")), KEY)
    exited = wait_for(lambda: next((e for e in events(redis_client, "job_exited") if e.job_id == 803), None),
                      timeout=15)
    assert exited.exit_code == 127
    assert "`jupyter` is not installed in this job's environment" in exited.output_tail
    assert "pip install jupyterlab" in exited.output_tail
