"""``colony login``: a wrong password is refused in the API's words and writes nothing; a right
one keeps the URL and token (mode 600) and later commands need no flags."""

import io
import os
import stat

import pytest

from cluster_ui.cli import main
from tests.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory


def colony(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return (code, *capsys.readouterr())


@pytest.fixture
def config(tmp_path, monkeypatch, live_server, transactional_db):
    MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision"))
    path = tmp_path / "colony" / "config.toml"
    monkeypatch.setenv("COLONY_CONFIG", str(path))
    monkeypatch.delenv("COLONY_TOKEN", raising=False)
    monkeypatch.delenv("COLONY_URL", raising=False)
    return path


def test_a_wrong_password_writes_nothing(config, live_server, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("not-it\n"))
    code, out, err = colony(capsys, "login", "--url", live_server.url, "-u", "alice", "--password-stdin")
    assert code == 1 and "Unable to log in with provided credentials" in err
    assert not config.exists()


def test_login_keeps_url_and_token_for_later_commands(config, live_server, monkeypatch, capsys):
    config.parent.mkdir(parents=True)
    config.write_text('editor = "vim"\n')
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    code, out, err = colony(capsys, "login", "--url", live_server.url, "-u", "alice", "--password-stdin")
    assert code == 0, err
    text = config.read_text()
    assert 'editor = "vim"' in text and f'url = "{live_server.url}/"' in text and "token = " in text
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
    code, out, err = colony(capsys, "queue")
    assert (code, out.strip()) == (0, "No jobs.")
