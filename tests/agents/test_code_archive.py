"""Code archives: the control plane stages a gzipped tar in Redis for the node, the launch names
it, the agent fetches and checks it and the job starts in an unpacked copy of its own. A hostile
archive (``..``, absolute names, links, devices, bombs) unpacks nothing and fails the launch."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from agents import code, protocol, signing
from agents.accounts import RunAsPolicy
from agents.code import CodeError, fetch, unpack
from agents.runner import JobRunner, LaunchError

from .helpers import events, launch, python, send_signed, wait_for
from .test_runner_sandbox import python_for_anyone, throwaway_account  # noqa: F401 (fixtures)

KEY = signing.node_key("c" * 32, "n1")

SHOW = """
import json, os
print(json.dumps({"cwd": os.getcwd(), "train": open("train.py").read(), "files": sorted(os.listdir("."))}))
"""


def archive(members: dict[str, bytes] | None = None, build=None) -> bytes:
    """A gzipped tar of ``members`` (name -> content); ``build(tar)`` adds anything else."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in (members or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        if build is not None:
            build(tar)
    return buffer.getvalue()


def stage(client, node: str, data: bytes, chunk: int = 100) -> protocol.CodeRef:
    """What the control plane does before it sends the launch: RPUSH the chunks, with a TTL."""
    key = protocol.code_key(node, hashlib.sha256(data).hexdigest())
    chunks = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    client.delete(key)
    client.rpush(key, *chunks)
    client.expire(key, 600)
    return protocol.CodeRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data), chunks=len(chunks))


def exited(client, job_id):
    return [e for e in events(client, "job_exited") if e.job_id == job_id]


def test_a_job_starts_in_its_unpacked_code_and_a_requeued_attempt_finds_its_checkpoint(
        redis_url, redis_client, start_agent):
    running = start_agent(redis_url, key=KEY)
    data = archive({"train.py": b"print('training')\n", "pkg/util.py": b"X = 1\n"})
    ref = stage(redis_client, "n1", data)
    first = launch(python(SHOW + "\nopen('checkpoint.txt', 'w').write('epoch 3')"), code=ref, attempt=0)
    send_signed(redis_client, "n1", first, KEY)
    [done] = wait_for(lambda: exited(redis_client, first.job_id), timeout=10)
    assert done.exit_code == 0, done.output_tail or done.error
    seen = json.loads(done.output_tail)
    folder = running.agent.runner.job_dir(first.job_id) / f"code-{ref.sha256[:12]}"
    assert seen == {"cwd": str(folder), "train": "print('training')\n", "files": ["pkg", "train.py"]}

    # The next attempt (a requeue) reuses that copy, checkpoint and all, without fetching again.
    redis_client.delete(protocol.code_key("n1", ref.sha256))
    second = first.model_copy(update={"command_id": "launch-again", "attempt": 1,
                                      "argv": python("print(open('checkpoint.txt').read())")})
    send_signed(redis_client, "n1", second, KEY)
    wait_for(lambda: [e for e in exited(redis_client, first.job_id) if e.launch_id == "launch-again"], timeout=10)
    [again] = [e for e in exited(redis_client, first.job_id) if e.launch_id == "launch-again"]
    assert (again.exit_code, again.output_tail) == (0, "epoch 3\n")


def test_an_archive_with_a_symlink_fails_the_launch_through_the_agent(redis_url, redis_client, start_agent, tmp_path):
    def link(tar):
        info = tarfile.TarInfo("secrets")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(info)

    running = start_agent(redis_url, key=KEY)
    ref = stage(redis_client, "n1", archive({"train.py": b""}, link))
    cmd = launch(python("print('ran')"), code=ref, attempt=0)
    send_signed(redis_client, "n1", cmd, KEY)
    [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=10)
    assert done.exit_code is None and "'secrets' is a symlink" in done.error
    assert not any(p.name.startswith("code-") for p in running.agent.runner.job_dir(cmd.job_id).iterdir())


def test_an_expired_or_tampered_archive_fails_the_launch(redis_url, redis_client, start_agent):
    start_agent(redis_url, key=KEY)
    data = archive({"train.py": b"print('hi')\n"})
    expired = protocol.CodeRef(sha256="ab" * 32, size=10, chunks=1)
    tampered = stage(redis_client, "n1", data)
    redis_client.lset(protocol.code_key("n1", tampered.sha256), 0, b"X" * 100)
    for ref, why in ((expired, "is not staged for node n1"), (tampered, "does not match its SHA-256")):
        cmd = launch(python("print('ran')"), code=ref, attempt=0)
        send_signed(redis_client, "n1", cmd, KEY)
        [done] = wait_for(lambda: exited(redis_client, cmd.job_id), timeout=10)
        assert done.exit_code is None and why in done.error, done.error


def test_fetch_checks_chunk_count_and_size(redis_client):
    data = archive({"a": b"1"})
    ref = stage(redis_client, "n9", data)
    assert fetch(redis_client, "n9", ref) == data
    with pytest.raises(CodeError, match="chunk"):
        fetch(redis_client, "n9", ref.model_copy(update={"chunks": ref.chunks + 1}))
    with pytest.raises(CodeError, match=f"is {len(data)} bytes, the launch says"):
        fetch(redis_client, "n9", ref.model_copy(update={"size": len(data) + 1}))


def _member(name, kind=tarfile.REGTYPE, linkname=""):
    def build(tar):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        if kind == tarfile.REGTYPE:
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        else:
            tar.addfile(info)
    return build


@pytest.mark.parametrize("build, why", [
    (_member("../escaped"), "climbs out"),
    (_member("ok/../../escaped"), "climbs out"),
    (_member("/tmp/escaped-absolute"), "absolute"),
    (_member("link", tarfile.SYMTYPE, "../../escaped"), "symlink"),
    (_member("hard", tarfile.LNKTYPE, "train.py"), "hard link"),
    (_member("fifo", tarfile.FIFOTYPE), "fifo"),
    (_member("null", tarfile.CHRTYPE), "device"),
])
def test_hostile_members_are_refused_and_nothing_is_left_behind(tmp_path, build, why):
    target = tmp_path / "jobs" / "1" / "code-x"
    target.parent.mkdir(parents=True)
    with pytest.raises(CodeError, match=why):
        unpack(archive({"train.py": b"ok"}, build), target)
    assert list(target.parent.iterdir()) == []  # no partial tree, no half-unpacked copy
    assert not (tmp_path / "jobs" / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert not Path("/tmp/escaped-absolute").exists()


def test_bounds_on_members_unpacked_bytes_and_decompression(tmp_path, monkeypatch):
    monkeypatch.setattr(code, "MAX_MEMBERS", 3)
    with pytest.raises(CodeError, match="more than 3 entries"):
        unpack(archive({f"f{i}": b"x" for i in range(4)}), tmp_path / "many")
    monkeypatch.setattr(code, "MAX_MEMBERS", 20_000)
    monkeypatch.setattr(code, "MAX_UNPACKED_BYTES", 1000)
    with pytest.raises(CodeError, match="unpacks to more than|decompresses to more than"):
        unpack(archive({"big": b"0" * 5000}), tmp_path / "big")
    # A bomb: a pax header that inflates to far more than any tar of bounded members could hold.
    def pax_bomb(tar):
        info = tarfile.TarInfo("small")
        info.pax_headers = {"comment": "a" * (8 * 1024 * 1024)}
        tar.addfile(info, io.BytesIO(b""))

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        pax_bomb(tar)
    assert len(buffer.getvalue()) < 64 * 1024
    monkeypatch.setattr(code, "_STREAM_OVERHEAD_BYTES", 0)
    with pytest.raises(CodeError, match="decompresses to more than"):
        unpack(buffer.getvalue(), tmp_path / "bomb")
    with pytest.raises(CodeError, match="not a readable gzipped tar"):
        unpack(b"not gzip at all", tmp_path / "garbage")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_modes_are_tamed_and_the_tree_belongs_to_the_jobs_account(passable_tmp_path, throwaway_account,  # noqa: F811
                                                                    python_for_anyone):  # noqa: F811
    tmp_path = passable_tmp_path
    def setuid_script(tar):
        info = tarfile.TarInfo("bin/run")
        info.size, info.mode, info.uid, info.gid = 3, 0o4777, 0, 0
        tar.addfile(info, io.BytesIO(b"hi\n"))

    account = throwaway_account
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(default=account, agent_uid=0), node="n1")
    data = archive({"train.py": b"print('x')\n"}, setuid_script)
    ref = protocol.CodeRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data), chunks=1)
    cmd = launch([python_for_anyone, "-c", "import os; open('ckpt', 'w').write('ok'); print(os.getcwd())"], code=ref)
    try:
        runner.launch(cmd, code_archive=data)
        [done] = wait_for(runner.poll, 10)
    finally:
        runner.stop_all(0)
        runner.close()
    folder = runner.code_dir(cmd)
    assert done.exit_code == 0, done.output_tail
    assert done.output_tail == f"{folder}\n"
    for path in (folder, folder / "train.py", folder / "bin", folder / "bin" / "run", folder / "ckpt"):
        info = os.lstat(path)
        assert (info.st_uid, info.st_gid) == (account.uid, account.gid), path
    assert stat.S_IMODE(os.lstat(folder / "bin" / "run").st_mode) & 0o7022 == 0  # no setuid, no world write
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_a_launch_without_the_archives_bytes_is_refused(tmp_path):
    runner = JobRunner(tmp_path / "agent", run_as=RunAsPolicy(allow_root=True), node="n1")
    ref = protocol.CodeRef(sha256="cd" * 32, size=10, chunks=1)
    with pytest.raises(LaunchError, match="was not fetched"):
        runner.launch(launch(["true"], code=ref))
    runner.close()


def test_a_nodes_acl_user_fetches_its_own_archive_and_not_another_nodes(redis_url, redis_client):
    import redis as redis_lib

    from .test_redis_acl import _node_client
    if int(redis_client.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("per-node ACL users need Redis 7 selectors")
    data = archive({"train.py": b"print(1)\n"})
    mine, theirs = stage(redis_client, "acl-a", data), stage(redis_client, "acl-b", data)
    client = _node_client(redis_url, "acl-a")
    try:
        assert fetch(client, "acl-a", mine) == data
        with pytest.raises(redis_lib.exceptions.NoPermissionError):
            fetch(client, "acl-b", theirs)
    finally:
        client.close()
        redis_client.acl_deluser(signing.redis_user("acl-a"))
