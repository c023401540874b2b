"""The ``colony`` command against a live server: submit, queue, show, logs, cancel, ``--json``,
exit codes (0 ok, 1 API error, 2 usage), and where it finds its URL and token."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rest_framework.authtoken.models import Token

from cluster_ui.cli import main
from cluster_ui.cli.client import ConfigError, resolve
from jobs.choices import JobState
from jobs.models import Job, JobWait
from tests.factories import JobFactory, MembershipFactory, TenantFactory, UserFactory

REPO = Path(__file__).resolve().parents[3]


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse and usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def colony_env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLONY_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("COLONY_URL", raising=False)
    monkeypatch.delenv("COLONY_TOKEN", raising=False)
    return monkeypatch


def test_the_whole_round_trip_against_a_live_server(live_server, transactional_db, colony_env, capsys):
    vision = TenantFactory(slug="vision")
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    charlie = MembershipFactory(user=UserFactory(username="charlie"), tenant=TenantFactory(slug="nlp")).user
    colony_env.setenv("COLONY_URL", live_server.url)
    colony_env.setenv("COLONY_TOKEN", Token.objects.create(user=alice).key)

    # --no-code: uploads have their own tests (test_colony_submit_options.py).
    code, out, _ = run(capsys, "submit", "--no-code", "--gpus", "2", "--memory", "20GiB", "--name", "train",
                       "--max-runtime", "2h", "--", "python", "train.py", "--epochs", "3")
    assert code == 0, out
    job = Job.objects.get(name="train")
    assert out.strip() == f"Submitted job {job.pk} (train) to vision: pending."
    assert (job.command, job.gpus, job.gpu_memory_mib, job.max_runtime_s) == (
        ["python", "train.py", "--epochs", "3"], 2, 20480, 7200)

    code, out, _ = run(capsys, "--json", "submit", "--no-code", "--gpu-fraction", "1/4", "--opportunistic",
                       "--", "python", "-V")
    small = json.loads(out)
    assert code == 0 and (small["gpu_milli"], small["gpus"], small["opportunistic_only"]) == (250, 1, True)

    JobWait.objects.create(job=job, reason={
        "code": "at_max_gpus", "message": "Tenant vision is at its 16-GPU ceiling", "details": {}},
        eta_at=int(time.time() + 300.4))
    code, out, _ = run(capsys, "queue")
    assert code == 0
    assert out.splitlines()[0].split()[:5] == ["ID", "NAME", "TENANT", "OWNER", "STATE"]
    # (whole seconds are stored: the second it is read in may round either way)
    assert re.search(r"Tenant vision is at its 16-GPU ceiling \(starts in ~(4 min 59 s|5 min)\)", out), out
    code, out, _ = run(capsys, "queue", "--json", "--mine")
    assert {j["id"] for j in json.loads(out)} == {job.pk, small["id"]}

    code, out, _ = run(capsys, "show", str(job.pk))
    assert code == 0 and "state       PENDING" in out and "python train.py --epochs 3" in out
    assert re.search(r"^  eta         in ~(4 min 59 s|5 min) \((\d{4}-\d\d-\d\d )?\d\d:\d\d UTC\)$", out, re.M), out
    spaced = JobFactory(tenant=vision, owner=alice, command=["python", "-c", "print('a b')"])
    code, out, _ = run(capsys, "show", str(spaced.pk))
    assert "python -c 'print('\"'\"'a b'\"'\"')'" in out  # quoted as a shell would need it

    Job.objects.filter(pk=small["id"]).update(state=JobState.FAILED, output_tail="Python 3.11\nboom\n", exit_code=1)
    code, out, _ = run(capsys, "logs", str(small["id"]))
    assert (code, out) == (0, "Python 3.11\nboom\n")

    code, out, _ = run(capsys, "cancel", str(job.pk))
    assert (code, out.strip()) == (0, f"Cancelled job {job.pk}.")
    code, _, err = run(capsys, "cancel", str(job.pk))
    assert code == 1 and "cancelled and cannot be cancelled" in err

    # Another tenant's job does not exist as far as alice can tell.
    theirs = JobFactory(tenant=charlie.memberships.get().tenant, owner=charlie)
    code, out, err = run(capsys, "show", str(theirs.pk))
    assert code == 1 and "No such job, or not one you can see." in err
    code, out, _ = run(capsys, "--json", "logs", str(theirs.pk))
    assert code == 1 and json.loads(out)["error"]["code"] == "not_found"

    # Refusals name the field, as the API does.
    code, _, err = run(capsys, "submit", "--no-code", "--gpus", "0", "--", "python")
    assert code == 1 and err.count("gpus: Ensure this value is greater than or equal to 1.") == 1  # said once
    code, _, err = run(capsys, "submit", "--no-code", "--tenant", "nlp", "--", "python")
    assert code == 1 and "tenant: Unknown tenant 'nlp'" in err

    colony_env.setenv("COLONY_TOKEN", "wrong")
    code, _, err = run(capsys, "queue")
    assert code == 1 and "Invalid token" in err


@pytest.mark.parametrize("argv, words", [
    (["submit", "--gpus", "1"], "give the command after --"),
    (["submit", "--memory", "lots", "--", "python"], "not a size"),
    (["submit", "--gpu-fraction", "2", "--", "python"], "between 0 and 1"),
    (["submit", "--gpus", "2", "--gpu-fraction", "0.5", "--", "python"], "share of one GPU"),
    (["show", "abc"], "invalid int value"),
    (["explode"], "invalid choice"),
])
def test_usage_errors_exit_2(colony_env, capsys, argv, words):
    colony_env.setenv("COLONY_TOKEN", "t")
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err


def test_no_token_is_a_usage_error(colony_env, capsys):
    code, _, err = run(capsys, "queue")
    assert code == 2 and "no API token" in err


def test_unreachable_server_is_an_api_error(colony_env, capsys):
    colony_env.setenv("COLONY_TOKEN", "t")
    colony_env.setenv("COLONY_URL", "http://127.0.0.1:9/")
    code, _, err = run(capsys, "queue")
    assert code == 1 and "cannot reach http://127.0.0.1:9/" in err


def test_config_file_then_environment_then_flags(colony_env, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('url = "http://colony.example:8000"\ntoken = "from-file"\n')
    colony_env.setenv("COLONY_CONFIG", str(config))
    assert resolve() == resolve(None, None)
    assert (resolve().url, resolve().token) == ("http://colony.example:8000/", "from-file")
    colony_env.setenv("COLONY_TOKEN", "from-env")
    assert resolve().token == "from-env"
    assert resolve(url="http://flag/", token="from-flag").token == "from-flag"
    config.write_text("token = [unclosed")
    with pytest.raises(ConfigError):
        resolve()


def test_xdg_config_location(colony_env, tmp_path):
    colony_env.delenv("COLONY_CONFIG")
    colony_env.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "colony").mkdir()
    (tmp_path / "colony" / "config.toml").write_text('token = "xdg"\n')
    assert resolve().token == "xdg"


CHECK = """
import importlib, sys, types
# Load the CLI without running cluster_ui/__init__.py (which loads the Celery app for Django).
package = types.ModuleType("cluster_ui"); package.__path__ = ["cluster_ui"]; sys.modules["cluster_ui"] = package
importlib.import_module("cluster_ui.cli")
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery', 'redis'))
assert not loaded, 'imported: ' + ', '.join(loaded[:10])
"""


def test_cli_code_uses_the_standard_library_only():
    result = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argv, name", [
    (["python", "train.py", "--epochs", "3"], "train.py"),
    (["/usr/bin/python3.11", "-u", "scripts/train.py"], "train.py"),
    (["python", "-m", "pkg.finetune", "--lr", "1e-4"], "pkg.finetune"),
    (["torchrun", "--nproc_per_node", "8", "train_ddp.py"], "train_ddp.py"),
    (["./run-experiment"], "run-experiment"),
    (["python"], "python"),
])
def test_jobs_are_named_for_what_they_run(argv, name):
    from cluster_ui.cli.main import default_name

    assert default_name(argv) == name


def test_a_runtime_limit_needs_a_unit(capsys, colony_env):
    code, _, err = run(capsys, "--url", "http://127.0.0.1:9", "--token", "t", "submit", "--max-runtime", "10",
                       "--", "python", "train.py")
    assert code == 2 and "give '10' a unit: 10s, 10m, 10h or 10d" in err


def test_env_and_stop_signal_are_checked_and_kept_by_the_server(live_server, transactional_db, colony_env, capsys):
    vision = TenantFactory(slug="vision")
    alice = MembershipFactory(user=UserFactory(username="alice"), tenant=vision).user
    colony_env.setenv("COLONY_URL", live_server.url)
    colony_env.setenv("COLONY_TOKEN", Token.objects.create(user=alice).key)
    code, out, err = run(capsys, "submit", "--no-code", "--name", "sim", "--env", "COLONY_SIM_WORKLOAD=train",
                         "--env", "EPOCHS=3", "--stop-signal", "SIGINT", "--", "python", "train.py")
    assert code == 0, err
    job = Job.objects.get(name="sim")
    assert (job.env, job.stop_signal) == ({"COLONY_SIM_WORKLOAD": "train", "EPOCHS": "3"}, "SIGINT")
    code, _, err = run(capsys, "submit", "--no-code", "--env", "CUDA_VISIBLE_DEVICES=0", "--", "python")
    assert code == 1 and "env: Set by Colony, cannot be overridden: CUDA_VISIBLE_DEVICES." in err, err
