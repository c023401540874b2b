"""``colony submit job.sh`` against a live server: the script's ``#COLONY`` lines are its flags
(read as sbatch reads ``#SBATCH``, the command line winning), it travels in the code upload and
runs by its shebang's interpreter; a bad line names its number and submits nothing."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from cluster_ui.cli import script
from cluster_ui.cli.client import Usage
from jobs.models import CodeArchive, Job
from tests.cluster_ui.cli.helpers import point_at, run

SWEEP = """#!/usr/bin/env python3 -u
# A sweep, as a Slurm user writes one.

#COLONY --gpus 2 --time 2h --name sweep   # two GPUs for two hours
#COLONY --env EPOCHS=3 --env LR=0.1
#COLONY --grace 90s --stop-signal SIGUSR1
import os
#COLONY --gpus 8
print(os.environ["EPOCHS"])
"""


@pytest.fixture
def colony(live_server, transactional_db, monkeypatch, tmp_path, alice):
    point_at(monkeypatch, tmp_path, live_server.url, alice)
    project = tmp_path / "project"
    (project / "jobs").mkdir(parents=True)
    monkeypatch.chdir(project)
    return project


def uploaded_names(job: Job) -> set[str]:
    data = gzip.decompress(bytes(CodeArchive.objects.get(pk=job.code_id).data))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return set(tar.getnames())


def test_a_batch_script_runs_with_the_flags_its_colony_lines_give(colony, capsys):
    (colony / "jobs" / "sweep.py").write_text(SWEEP)
    (colony / "data.txt").write_text("1 2 3\n")

    code, out, err = run(capsys, "submit", "--env", "LR=0.01", "jobs/sweep.py", "--seed", "7")
    assert code == 0, err
    job = Job.objects.get()
    assert out.strip() == f"Submitted job {job.pk} (sweep) to vision: pending."
    # The shebang's interpreter (its one argument kept whole, as the kernel passes it), the
    # script's path in the job's working directory, then the arguments given after it.
    assert job.command == ["/usr/bin/env", "python3 -u", "jobs/sweep.py", "--seed", "7"]
    assert (job.gpus, job.max_runtime_s, job.name) == (2, 7200, "sweep")  # not 8: that line follows the code
    assert job.env == {"EPOCHS": "3", "LR": "0.01"}  # the command line's LR wins, the script's EPOCHS stays
    assert (job.preempt_grace_s, job.stop_signal) == (90, "SIGUSR1")
    assert uploaded_names(job) >= {"jobs/sweep.py", "data.txt"}
    assert "sweep.py:8: #COLONY after the script's first command is ignored" in err


def test_command_line_flags_win_and_a_plain_sh_file_runs_with_bash(colony, capsys):
    (colony / "train.sh").write_text("#COLONY --gpus 4 --name from-script --priority 3\npython train.py\n")
    code, _, err = run(capsys, "submit", "--gpus", "1", "--name", "mine", "train.sh")
    assert code == 0, err
    job = Job.objects.get()
    assert (job.command, job.gpus, job.name, job.priority) == (["bash", "train.sh"], 1, "mine", 3)


@pytest.mark.parametrize("lines, words", [
    ("#!/bin/bash\n#COLONY --gpus 2\n#COLONY --gpus two\n", "job.sh:3: bad #COLONY line: argument --gpus: invalid int"),
    ("#!/bin/bash\n\n#COLONY --time 2x\n", "job.sh:3: bad #COLONY line: not a duration: '2x'"),
    ("#COLONY --tokn abc\n", "job.sh:1: bad #COLONY line: unrecognized arguments: --tokn"),
    ("#COLONY --token abc\n", "job.sh:1: bad #COLONY line: unrecognized arguments: --token"),
    ("#COLONY --gpus 2 python train.py\n", "job.sh:1: #COLONY lines take flags only"),
    ("#COLONY --name 'unclosed\n", "job.sh:1: bad #COLONY line: No closing quotation"),
    ("#COLONY --env 2X=1\n", "job.sh:1: bad #COLONY line: --env: not a variable name"),
    ("#COLONY --workdir /shared/x\n", "job.sh:1: --workdir belongs on the command line"),
])
def test_a_bad_colony_line_names_its_line_and_submits_nothing(colony, capsys, lines, words):
    (colony / "job.sh").write_text(lines + "echo hi\n")
    code, out, err = run(capsys, "submit", "job.sh")
    assert code == 2 and words in err, err
    assert out == ""
    assert not Job.objects.exists() and not CodeArchive.objects.exists()


def test_a_script_the_upload_would_not_carry_is_refused_before_anything_is_sent(colony, capsys, tmp_path):
    (colony / "ignored.sh").write_text("echo hi\n")
    (colony / ".colonyignore").write_text("*.sh\n")
    code, _, err = run(capsys, "submit", "ignored.sh")
    assert code == 2 and "ignored.sh would not be uploaded" in err

    outside = tmp_path / "elsewhere.sh"
    outside.write_text("#COLONY --gpus 2\necho hi\n")
    code, _, err = run(capsys, "submit", str(outside))
    assert code == 2 and "has #COLONY lines, but it is outside the directory being uploaded" in err

    (colony / "run.sh").write_text("#COLONY --gpus 2\necho hi\n")
    code, _, err = run(capsys, "submit", "--no-code", "run.sh")
    assert code == 2 and "run.sh has #COLONY lines, but --no-code uploads nothing" in err
    assert not Job.objects.exists() and not CodeArchive.objects.exists()


def test_a_script_the_job_does_not_get_uploaded_is_run_as_given_as_before(colony, capsys, tmp_path):
    launcher = tmp_path / "venv" / "bin" / "torchrun"  # an entry point, by its full path, also on the nodes
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/usr/bin/python3\nimport sys\n")
    code, _, err = run(capsys, "submit", "--", str(launcher), "train.py")
    assert code == 0, err
    (colony / "run.sh").write_text("echo hi\n")
    code, _, err = run(capsys, "submit", "--workdir", "/shared/proj", "--", "./run.sh")
    assert code == 0, err
    assert [job.command for job in Job.objects.order_by("pk")] == [[str(launcher), "train.py"], ["./run.sh"]]


def test_a_command_that_is_no_local_script_is_run_as_given(colony, capsys):
    (colony / "notes.txt").write_text("#COLONY --gpus 8\n")  # no shebang, not .sh: data, not a script
    code, _, err = run(capsys, "submit", "--", "python", "notes.txt")
    assert code == 0, err
    assert (Job.objects.get().command, Job.objects.get().gpus) == (["python", "notes.txt"], 1)


@pytest.mark.parametrize("text, interpreter, directives", [
    ("#!/bin/bash\n#COLONY --gpus 2\n", ("/bin/bash",), [(2, ("--gpus", "2"))]),
    ("#!/bin/sh -e\r\n#COLONY --name run#3 # note\r\n", ("/bin/sh", "-e"), [(2, ("--name", "run#3"))]),
    ("#COLONY\n#COLONY   --gpus 1\n", ("bash",), [(1, ()), (2, ("--gpus", "1"))]),
    ("#!/bin/bash\n#COLONYX --gpus 2\n# COLONY --gpus 3\n", ("/bin/bash",), []),  # not directives
    ("#!/bin/bash\n  #COLONY --gpus 2\n", ("/bin/bash",), []),  # indented: a comment, as sbatch reads it
    ("#!/bin/bash\necho\n#COLONY --gpus 2\n", ("/bin/bash",), []),  # after the first command
])
def test_colony_lines_are_read_from_the_top_as_sbatch_reads_sbatch_lines(tmp_path, text, interpreter, directives):
    path = tmp_path / "job.sh"
    path.write_text(text, newline="")
    batch = script.read(path)
    assert batch.interpreter == interpreter
    assert [(d.line, d.words) for d in batch.directives] == directives


def test_a_shebang_without_a_program_is_refused(tmp_path):
    path = tmp_path / "job"
    path.write_text("#!\necho\n")
    with pytest.raises(Usage, match="the shebang names no interpreter"):
        script.read(path)
