"""The submit form and the job page for what a researcher moving from Slurm expects: code to start
in, environments, arrays, dependencies and the preemption notice."""

import io
import tarfile

from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.models import Job, JobDependency
from tests.factories import JobFactory

FORM = {"command": "python train.py", "gpus": "1", "gpu_milli": "1000", "run_as": "auto", "priority": "0"}


def tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def form_errors(response) -> dict:
    return {name: list(errors) for name, errors in response.context["form"].errors.items()}


def test_the_form_takes_a_code_archive_and_the_job_page_names_it(alice, cluster, web):
    archive = SimpleUploadedFile("code.tar.gz", tarball({"train.py": b"print(1)\n", "data/x.txt": b"x"}),
                                 content_type="application/gzip")
    response = web(alice).post("/jobs/submit/", {**FORM, "code_archive": archive, "venv": "/shared/venvs/torch",
                                                 "preempt_grace": "2m", "stop_signal": "SIGUSR1",
                                                 "checkpoints": "on"})
    job = Job.objects.get()
    assert response.status_code == 302, form_errors(response)
    assert job.code.files == 2 and (job.venv, job.preempt_grace_s, job.stop_signal, job.checkpoints) == \
        ("/shared/venvs/torch", 120, "SIGUSR1", True)
    page = web(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert f"uploaded code <code title=\"{job.code.sha256}\">{job.code.sha256[:12]}</code> (2 files)" in page
    assert "virtualenv <code>/shared/venvs/torch</code>" in page
    assert "SIGUSR1, then SIGKILL after 120 s · checkpoints" in page


def test_a_bad_archive_is_refused_on_its_field(alice, cluster, web):
    archive = SimpleUploadedFile("code.tar.gz", b"not a tarball", content_type="application/gzip")
    response = web(alice).post("/jobs/submit/", {**FORM, "code_archive": archive})
    assert response.status_code == 200 and not Job.objects.exists()
    assert "Not a gzipped tar archive" in form_errors(response)["code_archive"][0]


def test_an_array_with_a_dependency_from_the_form(alice, vision, cluster, web):
    first = JobFactory(tenant=vision, owner=alice)
    response = web(alice).post("/jobs/submit/", {**FORM, "array": "0-3%2", "after_ok": f"{first.pk}"}, follow=True)
    tasks = list(Job.objects.exclude(pk=first.pk).order_by("array_index"))
    assert [t.array_index for t in tasks] == [0, 1, 2, 3] and tasks[0].array.max_running == 2
    assert JobDependency.objects.filter(on=first).count() == 4
    page = response.content.decode()
    assert f"Array {tasks[0].array_id} submitted: 4 jobs" in page and "at most 2 at once" in page
    assert f"index 0 of <a href=\"/jobs/?array={tasks[0].array_id}\">array {tasks[0].array_id}</a> (0-3%2)" in page
    assert f"#{first.pk}</a> after it succeeds" in page
    queue = web(alice).get(f"/jobs/?array={tasks[0].array_id}").content.decode()
    assert queue.count('<span class="muted">[') == 4


def test_dependency_ids_must_be_numbers(alice, cluster, web):
    response = web(alice).post("/jobs/submit/", {**FORM, "after_any": "41, abc"})
    assert "Give job ids separated by commas" in form_errors(response)["after_any"][0]


def test_a_missing_or_foreign_page_is_colonys_own_not_found(alice, charlie, nlp, web):
    theirs = JobFactory(tenant=nlp, owner=charlie)
    for path in (f"/jobs/{theirs.pk}/", "/no/such/page/"):
        response = web(alice).get(path)
        body = response.content.decode()
        assert response.status_code == 404
        assert "<h1>Not found</h1>" in body and "not one you can see" in body
        assert "URLconf" not in body and "Queue</a>" in body  # Colony's page, not Django's
