"""``colony submit`` against a stand-in API that records what it is sent: the code upload (and
``code`` in the job), ``--workdir``/``--no-code``, environments, preemption notice, arrays and
dependencies; and ``colony show``/``queue`` printing those fields. The real endpoints get an
end-to-end test of their own."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cluster_ui.cli import main

JOB = {"id": 5, "name": "train.py", "tenant": "vision", "owner": "alice", "state": "PENDING", "gpus": 1,
       "gpu_milli": 1000, "gpu_memory_mib": None, "priority": 0, "run_class": None, "command": ["python", "train.py"],
       "submitted_at": "2026-01-01T00:00:00Z", "started_at": None, "finished_at": None, "allocations": []}


class FakeApi:
    """Answers each path from ``replies`` (status, JSON) and keeps every request it got."""

    def __init__(self):
        self.requests: list[dict] = []
        self.replies: dict[str, tuple[int, object]] = {
            "/api/v1/code/": (201, {"sha256": "ab" * 32, "size": 10, "files": 1, "unpacked_size": 9}),
            "/api/v1/jobs/": (201, JOB),
        }

    def sent(self, path: str) -> list[dict]:
        return [request for request in self.requests if request["path"] == path]


@pytest.fixture
def api(monkeypatch, tmp_path):
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def answer(self):
            path, _, query = self.path.partition("?")
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            fake.requests.append({"method": self.command, "path": path, "query": query, "body": body,
                                  "headers": dict(self.headers)})
            status, reply = fake.replies.get(path, (404, {"detail": "Not found."}))
            payload = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("COLONY_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("COLONY_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("COLONY_TOKEN", "t0ken")
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('training')\n")
    (project / ".gitignore").write_text("*.ckpt\n")
    (project / "last.ckpt").write_text("weights")
    monkeypatch.chdir(project)
    yield fake
    server.shutdown()
    server.server_close()


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def job_sent(api: FakeApi) -> dict:
    [request] = api.sent("/api/v1/jobs/")
    return json.loads(request["body"])


def test_submit_uploads_the_current_directory_and_runs_the_job_in_it(api, capsys):
    code, out, err = run(capsys, "submit", "--gpus", "1", "--", "python", "train.py")
    assert code == 0, err
    [upload] = api.sent("/api/v1/code/")
    assert upload["headers"]["Content-Type"] == "application/gzip"
    assert upload["headers"]["Authorization"] == "Token t0ken"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(upload["body"]))) as tar:
        assert tar.getnames() == [".gitignore", "train.py"]  # last.ckpt is ignored
    assert job_sent(api)["code"] == "ab" * 32  # the server's name for it
    assert re.fullmatch(rf"Uploaded code: 2 files, \d+ B \(sha256 {'ab' * 6}…\)\n", err)
    assert out.strip() == "Submitted job 5 (train.py) to vision: pending."  # stdout stays the answer


def test_code_already_on_the_server_is_said_so(api, capsys):
    api.replies["/api/v1/code/"] = (200, {"sha256": "cd" * 32, "size": 10, "files": 2, "unpacked_size": 9})
    code, _, err = run(capsys, "submit", "--tenant", "vision", "--", "python", "train.py")
    assert code == 0 and err.startswith("Code already uploaded: 2 files")
    assert api.sent("/api/v1/code/")[0]["query"] == "tenant=vision"
    assert job_sent(api)["code"] == "cd" * 32


def test_code_from_another_directory_and_skipped_links_are_named(api, capsys, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "eval.py").write_text("")
    os.symlink("eval.py", other / "latest.py")
    code, _, err = run(capsys, "submit", "--code", str(other), "--", "python", "eval.py")
    assert code == 0
    assert "Uploaded code: 1 file," in err and "; skipped 1 symbolic link (latest.py)" in err


def test_workdir_and_no_code_upload_nothing(api, capsys):
    code, _, err = run(capsys, "submit", "--workdir", "/shared/alice/proj", "--", "python", "train.py")
    assert code == 0 and err == ""
    assert job_sent(api)["workdir"] == "/shared/alice/proj" and "code" not in job_sent(api)
    api.requests.clear()
    code, _, _ = run(capsys, "submit", "--no-code", "--", "python", "train.py")
    assert code == 0 and not api.sent("/api/v1/code/")
    assert "code" not in job_sent(api) and "workdir" not in job_sent(api)


def test_every_new_option_reaches_the_job(api, capsys):
    code, _, err = run(capsys, "submit", "--no-code", "--image", "pytorch/pytorch:2.3", "--venv", "/opt/venvs/a",
                       "--preempt-grace", "90s", "--checkpoints", "--after-ok", "41", "--after-ok", "42,43",
                       "--after-any", "44", "--", "python", "train.py")
    assert code == 0, err
    body = job_sent(api)
    assert {key: body[key] for key in ("image", "venv", "preempt_grace_s", "checkpoints", "after_ok", "after_any")} == {
        "image": "pytorch/pytorch:2.3", "venv": "/opt/venvs/a", "preempt_grace_s": 90, "checkpoints": True,
        "after_ok": [41, 42, 43], "after_any": [44]}
    api.requests.clear()
    run(capsys, "submit", "--no-code", "--conda", "/opt/conda/envs/x", "--preempt-grace", "5m", "--", "python")
    assert (job_sent(api)["conda"], job_sent(api)["preempt_grace_s"]) == ("/opt/conda/envs/x", 300)
    assert "venv" not in job_sent(api) and "checkpoints" not in job_sent(api)


def test_cores_and_host_memory_reach_the_job(api, capsys):
    code, _, err = run(capsys, "submit", "--no-code", "--cpus", "12", "--host-memory", "96GiB", "--", "python", "t.py")
    assert code == 0, err
    assert (job_sent(api)["cpus"], job_sent(api)["host_memory_mib"]) == ("12", 96 * 1024)


@pytest.mark.parametrize("argv, fields", [
    # A bare size is GiB, as in the submit form; the agent's --host-memory refuses one (it meant MiB).
    (["--memory", "20", "--host-memory", "64"], {"gpu_memory_mib": 20480, "host_memory_mib": 65536}),
    (["--memory", "512MiB", "--host-memory", "1.5T"], {"gpu_memory_mib": 512, "host_memory_mib": 1572864}),
    (["--time", "1h30m", "--grace", "2 min"], {"max_runtime_s": 5400, "preempt_grace_s": 120}),
    (["--time", "1-02:00:00"], {"max_runtime_s": 93600}),  # sbatch's --time, as a batch script may carry it
])
def test_sizes_and_durations_read_as_the_form_reads_them(api, capsys, argv, fields):
    code, _, err = run(capsys, "submit", "--no-code", *argv, "--", "python", "t.py")
    assert code == 0, err
    assert {name: job_sent(api)[name] for name in fields} == fields


def test_an_array_submit_says_how_many_and_which(api, capsys):
    api.replies["/api/v1/jobs/"] = (201, {"array": {"id": 7, "name": "train.py", "spec": "0-99%8", "size": 100,
                                                     "max_running": 8}, "jobs": list(range(101, 201))})
    code, out, _ = run(capsys, "submit", "--no-code", "--array", "0-99%8", "--", "python", "train.py")
    assert code == 0 and job_sent(api)["array"] == "0-99%8"
    assert out.strip() == "Submitted array 7: 100 jobs (101-200), at most 8 at once."
    api.replies["/api/v1/jobs/"] = (201, {"array": {"id": 8, "name": "t", "spec": "1,3", "size": 2,
                                                     "max_running": None}, "jobs": [300, 302]})
    code, out, _ = run(capsys, "submit", "--no-code", "--array", "1,3", "--", "python", "train.py")
    assert out.strip() == "Submitted array 8: 2 jobs (300, 302)."
    code, out, _ = run(capsys, "--json", "submit", "--no-code", "--array", "1,3", "--", "python", "train.py")
    assert json.loads(out)["jobs"] == [300, 302]


@pytest.mark.parametrize("argv, words", [
    (["--workdir", "proj"], "--workdir is a path on the node"),
    (["--workdir", "/x", "--no-code"], "not allowed with argument"),
    (["--venv", "/a", "--conda", "/b"], "not allowed with argument"),
    (["--preempt-grace", "90"], "give '90' a unit"),
    (["--memory", "20 PB"], "not a size: '20 PB'"),
    (["--after-ok", "41,job"], "--after-ok takes job ids"),
])
def test_bad_options_are_usage_errors_and_send_nothing(api, capsys, argv, words):
    code, _, err = run(capsys, "submit", *argv, "--", "python", "train.py")
    assert code == 2 and words in err and api.requests == []


def test_a_directory_too_big_to_upload_is_refused_before_sending(api, capsys, monkeypatch):
    from cluster_ui.cli import pack

    monkeypatch.setattr(pack, "MAX_FILES", 3)
    for index in range(5):
        (Path.cwd() / f"shard{index}.npy").write_text("")
    code, _, err = run(capsys, "submit", "--", "python", "train.py")
    assert code == 2 and "more than 3 files" in err and ".colonyignore" in err
    assert err.count("colony: error:") == 1 and api.requests == []


def test_a_server_without_code_uploads_says_what_to_do_instead(api, capsys):
    del api.replies["/api/v1/code/"]
    code, _, err = run(capsys, "submit", "--", "python", "train.py")
    assert code == 1 and "does not take code uploads; give --workdir PATH" in err
    assert not api.sent("/api/v1/jobs/")


def test_an_upload_the_server_refuses_prints_its_reason_once(api, capsys):
    api.replies["/api/v1/code/"] = (400, {"detail": "Archive member 'x' is a link."})
    code, _, err = run(capsys, "submit", "--", "python", "train.py")
    assert (code, err.strip()) == (1, "colony: error: Archive member 'x' is a link.")


def test_show_prints_the_contract_fields_that_are_set(api, capsys):
    api.replies["/api/v1/jobs/5/"] = (200, {**JOB, "code": "ab" * 32, "image": "pytorch/pytorch:2.3",
                                            "conda": "/opt/conda/envs/x", "array_id": 7, "array_index": 3,
                                            "dependencies": [{"job": 41, "kind": "ok"}, {"job": 44, "kind": "any"}],
                                            "preempt_grace_s": 90, "checkpoints": True, "preemptions": 2,
                                            "lost_work_s": 840, "mig_profile": "1g.10gb", "accepts_unfenced": False})
    code, out, _ = run(capsys, "show", "5")
    assert code == 0
    for line in (f"  code        uploaded, sha256 {'ab' * 6}…", "  image       pytorch/pytorch:2.3",
                 "  MIG         one 1g.10gb instance", "  unfenced    never shares unfenced GPUs",
                 "  conda       /opt/conda/envs/x", "  array       7, index 3",
                 "  after       job 41 succeeds, job 44 ends", "  preemption  1 min 30 s notice, checkpoints",
                 "  preempted   2 times, 14 min of work lost"):
        assert line in out.splitlines()
    assert "workdir" not in out and "venv" not in out


def test_show_leaves_out_what_is_not_set(api, capsys):
    api.replies["/api/v1/jobs/5/"] = (200, {**JOB, "workdir": "/shared/p", "code": None, "array_id": None,
                                            "array_index": None, "dependencies": [], "preemptions": 0,
                                            "lost_work_s": 0, "checkpoints": False, "preempt_grace_s": None})
    code, out, _ = run(capsys, "show", "5")
    assert "  workdir     /shared/p (on the node)" in out.splitlines()
    for word in ("code ", "array", "after", "preempt", "MIG", "unfenced"):
        assert word not in out


def test_queue_names_array_members_by_index(api, capsys):
    api.replies["/api/v1/queue/"] = (200, {"next": None, "results": [
        {**JOB, "id": 103, "array_id": 7, "array_index": 3, "queue_position": None},
        {**JOB, "id": 104, "array_id": None, "array_index": None, "queue_position": None}]})
    code, out, _ = run(capsys, "queue")
    rows = [line.split()[:2] for line in out.splitlines()[1:]]
    assert code == 0 and rows == [["103", "train.py[3]"], ["104", "train.py"]]


def test_env_and_stop_signal_reach_the_job(api, capsys):
    code, _, err = run(capsys, "submit", "--no-code", "--env", "EPOCHS=3", "--env", "OPTS=--lr=0.1 -v",
                       "--env", "EMPTY=", "--stop-signal", "SIGUSR1", "--", "python", "train.py")
    assert code == 0, err
    body = job_sent(api)
    assert body["env"] == {"EPOCHS": "3", "OPTS": "--lr=0.1 -v", "EMPTY": ""}
    assert body["stop_signal"] == "SIGUSR1"
    api.requests.clear()
    run(capsys, "submit", "--no-code", "--", "python", "train.py")
    assert "env" not in job_sent(api) and "stop_signal" not in job_sent(api)  # the server's defaults


@pytest.mark.parametrize("argv, words", [
    (["--env", "EPOCHS"], "--env takes NAME=VALUE"),
    (["--env", "2FAST=1"], "not a variable name: '2FAST'"),
    (["--env", "A=1", "--env", "A=2"], "--env A is given twice"),
    (["--stop-signal", "SIGKILL"], "invalid choice: 'SIGKILL'"),
])
def test_bad_env_or_stop_signal_is_a_usage_error_and_sends_nothing(api, capsys, argv, words):
    code, _, err = run(capsys, "submit", "--no-code", *argv, "--", "python", "train.py")
    assert code == 2 and words in err and api.requests == [], err


def test_submit_help_names_the_preemption_notice_file(capsys):
    code, out, _ = run(capsys, "submit", "--help")
    assert code == 0
    flat = " ".join(out.split())  # argparse wraps the help text
    assert "COLONY_PREEMPT_FILE" in flat and "COLONY_PREEMPT_AT" not in flat
    assert "--env NAME=VALUE" in flat and "--stop-signal" in flat


def test_show_prints_when_a_pending_job_may_start(api, capsys):
    from datetime import datetime, timedelta, timezone

    eta = (datetime.now(timezone.utc) + timedelta(minutes=12, seconds=30)).replace(microsecond=0)
    api.replies["/api/v1/jobs/5/"] = (200, {**JOB, "eta_s": 750.0, "pending_reason": {
        "code": "waiting_for_free_gpus", "message": "Waiting for 2 GPUs", "details": {},
        "eta_at": eta.isoformat().replace("+00:00", "Z")}})
    code, out, _ = run(capsys, "show", "5")
    assert code == 0
    lines = out.splitlines()
    assert "  pending     Waiting for 2 GPUs" in lines
    [line] = [line for line in lines if line.startswith("  eta ")]
    assert re.fullmatch(rf"  eta         in ~12 min (29|30) s \((\d{{4}}-\d\d-\d\d )?{eta:%H:%M} UTC\)", line), line
    api.replies["/api/v1/jobs/5/"] = (200, {**JOB, "eta_s": None, "pending_reason": {
        "code": "waiting_for_free_gpus", "message": "Waiting for 2 GPUs", "details": {}, "eta_at": None}})
    code, out, _ = run(capsys, "show", "5")
    assert "eta" not in out
