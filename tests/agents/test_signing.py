"""Agent credentials: per-node keys from one secret, signatures over the exact message bytes, and
an agent that signs everything it writes with the key it is given (--key-file, $COLONY_AGENT_KEY)."""

import json
import os

import pytest

from agents import cli, protocol, signing
from tests.agents.helpers import events, launch, python, samples, send_signed, wait_for

SECRET = "s" * 32


def test_keys_differ_per_node_and_per_secret_and_never_change():
    key = signing.node_key(SECRET, "node-a")
    assert len(key) == 32
    assert key == signing.node_key(SECRET, "node-a")
    assert key != signing.node_key(SECRET, "node-b")
    assert key != signing.node_key("t" * 32, "node-a")
    assert signing.redis_password(SECRET, "node-a") != key.hex()


@pytest.mark.parametrize("secret, node", [("short", "node-a"), (SECRET, "a/b"), (SECRET, "")])
def test_a_short_secret_or_a_bad_node_name_makes_no_key(secret, node):
    with pytest.raises(ValueError):
        signing.node_key(secret, node)


def test_a_signature_verifies_only_with_the_same_key_and_the_same_bytes():
    key, other = signing.node_key(SECRET, "node-a"), signing.node_key(SECRET, "node-b")
    payload = '{"v": 1, "node": "node-a"}'
    sig = signing.sign(key, payload)
    assert signing.verify(key, payload.encode(), sig.encode())  # as Redis hands them back
    assert not signing.verify(other, payload, sig)
    assert not signing.verify(key, payload.replace("node-a", "node-b"), sig)
    assert not signing.verify(key, payload + " ", sig)
    for forged in (None, "", "00" * 32, sig[:-1], "\xff" * 64, b"\xff" * 64):
        assert not signing.verify(key, payload, forged)


def test_parse_key_takes_64_hex_digits_and_nothing_else():
    key = signing.node_key(SECRET, "node-a")
    assert signing.parse_key(f"  {key.hex()}\n") == key
    for bad in ("", "abc", key.hex()[:-2], key.hex() + "00", "zz" * 32):
        with pytest.raises(ValueError, match="64 hex digits"):
            signing.parse_key(bad)


def test_signed_fields_carry_the_signature_of_m_and_still_decode():
    key = signing.node_key(SECRET, "n1")
    message = protocol.JobStarted(node="n1", job_id=1, pid=2, started_at=0.0)
    fields = signing.signed(protocol.encode(message), key)
    assert set(fields) == {"m", "sig"} and signing.verify(key, fields["m"], fields["sig"])
    assert protocol.decode_event(fields) == message
    assert signing.signed(protocol.encode(message), None) == protocol.encode(message)


def test_commands_take_a_signature_field_and_nothing_else():
    command = launch(["true"])
    assert protocol.decode_command({**protocol.encode(command), "sig": "00"}) == command
    with pytest.raises(protocol.ProtocolError, match="unexpected stream fields: signature"):
        protocol.decode_command({**protocol.encode(command), "signature": "00"})


# ---------------------------------------------------------------- the agent signs what it writes


def _all_signed_by(client, stream, key) -> list:
    entries = client.xrange(stream)
    assert entries
    assert all(signing.verify(key, fields[b"m"], fields.get(b"sig")) for _id, fields in entries), entries
    return entries


def test_an_agent_with_a_key_signs_registration_events_and_samples(redis_url, redis_client, start_agent):
    key = signing.node_key(SECRET, "n1")
    start_agent(redis_url, key=key)
    wait_for(lambda: samples(redis_client))
    job = launch(python("print('hi')"), attempt=0)
    send_signed(redis_client, "n1", job, key)
    wait_for(lambda: events(redis_client, "job_exited"))
    kinds = [json.loads(fields[b"m"])["kind"]
             for _id, fields in _all_signed_by(redis_client, protocol.node_events_stream("n1"), key)]
    assert kinds[:1] == ["node_registered"] and {"job_started", "job_exited"} <= set(kinds)
    _all_signed_by(redis_client, protocol.node_metrics_stream("n1"), key)


def test_an_agent_without_a_key_sends_unsigned_messages(redis_url, redis_client, start_agent):
    start_agent(redis_url)
    wait_for(lambda: samples(redis_client) and events(redis_client))
    for stream in (protocol.node_events_stream("n1"), protocol.node_metrics_stream("n1")):
        assert all(set(fields) == {b"m"} for _id, fields in redis_client.xrange(stream))


# ---------------------------------------------------------------- where the agent finds its key


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("COLONY_AGENT_KEY", "COLONY_AGENT_KEY_FILE", "COLONY_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _args(*extra):
    return cli.parse_args(["--node", "n1", "--simulate", "1xT4-16GB", *extra])


def test_key_from_a_file_and_a_warning_when_others_can_read_it(clean_env, tmp_path):
    key = signing.node_key(SECRET, "n1")
    path = tmp_path / "agent.key"
    path.write_text(key.hex() + "\n")
    path.chmod(0o600)
    args = _args("--key-file", str(path))
    assert (args.key, args.key_warning) == (key, "")
    path.chmod(0o644)
    assert "readable by other users" in _args("--key-file", str(path)).key_warning


def test_key_from_the_environment_is_removed_from_it_once_read(clean_env, tmp_path):
    key = signing.node_key(SECRET, "n1")
    clean_env.setenv("COLONY_AGENT_KEY", key.hex())
    assert _args().key == key
    assert "COLONY_AGENT_KEY" not in os.environ  # jobs can never inherit it, whatever --pass-env says
    path = tmp_path / "k"
    path.write_text(key.hex())
    clean_env.setenv("COLONY_AGENT_KEY_FILE", str(path))
    assert _args().key == key and "COLONY_AGENT_KEY_FILE" not in os.environ


def test_no_key_means_unsigned(clean_env):
    assert _args().key is None


@pytest.mark.parametrize("content", ["not a key", "ab" * 31])
def test_a_bad_or_missing_key_file_is_an_argument_error(clean_env, tmp_path, capsys, content):
    path = tmp_path / "agent.key"
    path.write_text(content)
    with pytest.raises(SystemExit) as exited:
        _args("--key-file", str(path))
    assert exited.value.code == 2
    assert "64 hex digits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _args("--key-file", str(tmp_path / "missing"))


def test_a_redis_url_with_user_and_password_is_accepted_and_its_password_never_shown(clean_env, capsys):
    url = "redis://colony-node-n1:s3cret@redis.example:6379/0"
    assert _args("--redis", url).redis == url
    assert cli.redacted_url(url) == "redis://colony-node-n1:***@redis.example:6379/0"
    assert cli.redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    clean_env.setenv("COLONY_REDIS_URL", url)
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    assert "s3cret" not in capsys.readouterr().out
