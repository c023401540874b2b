"""The README's quick start, as a newcomer types it: ``colony login``, then from a directory with
``train.py``: ``colony submit --gpus 1 -- python train.py``. The code travels (what .gitignore
names stays home), the job runs in it on a real agent, and ``colony logs`` prints what it said."""

import io
import os
import stat

import pytest

from cluster_ui.cli import main
from jobs.models import Job
from tests.e2e.conftest import wait_for
from tests.factories import PASSWORD, MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.e2e

TRAIN = """\
import os, pathlib
print("hello from", pathlib.Path.cwd().name.split("-")[0])
print("lib says", pathlib.Path("lib/util.txt").read_text().strip())
print("ignored data came along:", os.path.exists("data/big.bin"))
"""


def colony(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_quick_start_runs_as_written(stack, live_server, tmp_path, monkeypatch, capsys):
    MembershipFactory(user=UserFactory(username="alice"), tenant=TenantFactory(slug="vision"))
    config = tmp_path / "home" / "colony.toml"
    monkeypatch.setenv("COLONY_CONFIG", str(config))
    monkeypatch.setenv("COLONY_URL", live_server.url)
    monkeypatch.delenv("COLONY_TOKEN", raising=False)
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "lib" / "util.txt").write_text("packed\n")
    (project / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (project / ".gitignore").write_text("data/\n")

    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    code, out, err = colony(capsys, "login", "--username", "alice", "--password-stdin")
    assert code == 0, err
    assert f"Logged in to {live_server.url}/ as alice" in out
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600  # it holds a token

    monkeypatch.chdir(project)
    code, out, err = colony(capsys, "submit", "--gpus", "1", "--", "python", "train.py")
    assert code == 0, err
    assert "Uploaded code: 3 files" in err  # train.py, lib/util.txt, .gitignore; not data/
    job = Job.objects.get()
    wait_for(lambda: Job.objects.filter(pk=job.pk, state__in=("SUCCEEDED", "FAILED")).exists(), timeout=60,
             what="the job to end")
    code, out, err = colony(capsys, "logs", str(job.pk))
    assert code == 0, err
    assert "hello from code" in out and "lib says packed" in out, out
    assert "ignored data came along: False" in out
    assert Job.objects.get(pk=job.pk).state == "SUCCEEDED"
