"""``manage.py agent_key NODE`` and ``manage.py agent_acl NODE``: the credentials an operator installs
on a node, derived from COLONY_AGENT_SECRET."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents import protocol, signing
from monitoring.services.registry import authenticate

SECRET = "command-test-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def secret(settings):
    settings.COLONY_AGENT_SECRET = SECRET
    settings.COLONY_AGENT_AUTH = "required"
    settings.REDIS_URL = "redis://:admin-pw@redis.internal:6379/0"


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_agent_key_prints_a_key_whose_signatures_the_server_accepts():
    key = signing.parse_key(run("agent_key", "gpu-01"))
    message = protocol.JobStarted(node="gpu-01", job_id=1, pid=2, started_at=0.0)
    fields = signing.signed(protocol.encode(message), key)
    authenticate(fields, message)  # does not raise
    other = signing.signed(protocol.encode(message), signing.parse_key(run("agent_key", "gpu-02")))
    with pytest.raises(protocol.ProtocolError, match="bad signature"):
        authenticate(other, message)


def test_agent_acl_prints_the_nodes_acl_line_and_its_redis_url():
    password = signing.redis_password(SECRET, "gpu-01")
    assert run("agent_acl", "gpu-01") == signing.redis_acl_setuser("gpu-01", password)
    assert run("agent_acl", "gpu-01", "--url") == f"redis://colony-node-gpu-01:{password}@redis.internal:6379/0"


@pytest.mark.parametrize("command", ["agent_key", "agent_acl"])
def test_credentials_need_the_secret_and_a_valid_node_name(settings, command):
    with pytest.raises(CommandError, match="invalid node name"):
        run(command, "a/b")
    settings.COLONY_AGENT_SECRET = ""
    with pytest.raises(CommandError, match="COLONY_AGENT_SECRET"):
        run(command, "gpu-01")


def test_agent_key_writes_owner_only_key_files_that_the_agent_loads(tmp_path):
    from agents.cli import load_key

    (tmp_path / "gpu-02.key").write_text("stale")
    (tmp_path / "gpu-02.key").chmod(0o644)
    out = run("agent_key", "gpu-01", "gpu-02", "--write-dir", str(tmp_path))
    assert out.splitlines() == [f"wrote {tmp_path / 'gpu-01.key'}", f"wrote {tmp_path / 'gpu-02.key'}"]
    for node in ("gpu-01", "gpu-02"):
        path = tmp_path / f"{node}.key"
        assert path.stat().st_mode & 0o777 == 0o600
        key, warning = load_key(path)
        assert (key, warning) == (signing.node_key(SECRET, node), "")


def test_agent_key_prints_one_line_per_node_for_several():
    lines = run("agent_key", "gpu-01", "gpu-02").splitlines()
    assert lines == [f"{n} {signing.node_key(SECRET, n).hex()}" for n in ("gpu-01", "gpu-02")]
