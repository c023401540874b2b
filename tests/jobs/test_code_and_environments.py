"""Where a job starts and in what: code archives uploaded through the API reach the node that runs
the job, and workdir, image, venv/conda and the stop signal travel in its launch."""

import hashlib
import io
import os
import tarfile

import pytest

from agents import protocol
from jobs.models import Job
from jobs.services import code
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.models import Node
from tests.factories import GpuFactory, MembershipFactory, NodeFactory, TenantFactory, UserFactory


def tarball(files: dict[str, bytes], *, link: tuple[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tar.addfile(info)
    return buffer.getvalue()


@pytest.fixture
def node1(db, redis_client, live_redis):
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    redis_client.set(protocol.heartbeat_key("n1"), "{}", ex=60)
    return node


def upload(client, data: bytes, tenant: str = "vision"):
    return client.post(f"/api/v1/code/?tenant={tenant}", data=data, content_type="application/gzip")


def launches(redis_client, node="n1"):
    return [c for _, f in redis_client.xrange(protocol.command_stream(node))
            if isinstance(c := protocol.decode_command(f), protocol.LaunchJob)]


def test_uploaded_code_is_stored_once_and_reaches_the_node_that_runs_the_job(
        alice, api, node1, redis_client, django_capture_on_commit_callbacks):
    client = api(alice)
    data = tarball({"train.py": b"print('hello from the upload')\n", "lib/util.py": b"X = 1\n"})
    first = upload(client, data)
    assert first.status_code == 201, first.content
    assert first.json() == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "files": 2,
                            "unpacked_size": 37}
    assert upload(client, data).status_code == 200  # the same tree again: nothing new stored

    submitted = client.post("/api/v1/jobs/", {"command": ["python", "train.py"], "gpus": 1,
                                              "code": first.json()["sha256"]}, format="json")
    assert submitted.status_code == 201, submitted.content
    assert submitted.json()["code"] == first.json()["sha256"]
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    (launch,) = launches(redis_client)
    assert launch.code.sha256 == first.json()["sha256"] and launch.workdir is None
    staged = b"".join(redis_client.lrange(protocol.code_key("n1", launch.code.sha256), 0, -1))
    assert staged == data and len(redis_client.lrange(protocol.code_key("n1", launch.code.sha256), 0, -1)) == \
        launch.code.chunks
    assert redis_client.ttl(protocol.code_key("n1", launch.code.sha256)) > 3600


def test_a_big_archive_is_staged_in_chunks_under_the_redis_bulk_limit(db, redis_client, vision):
    data = tarball({"weights.bin": os.urandom(3 * protocol.CODE_CHUNK_BYTES // 2)})  # incompressible
    archive, _ = code.store(vision, None, data)
    ref = code.stage(redis_client, "n1", archive.pk)
    chunks = redis_client.lrange(protocol.code_key("n1", archive.sha256), 0, -1)
    assert ref.chunks == len(chunks) > 1
    assert max(map(len, chunks)) <= protocol.CODE_CHUNK_BYTES and b"".join(chunks) == data


@pytest.mark.parametrize("data, words", [
    (tarball({"../escape.py": b"x"}), "not a relative path"),
    (tarball({"/etc/cron.d/evil": b"x"}), "not a relative path"),
    (tarball({"ok.py": b"x"}, link=("data", "/etc")), "not a regular file or directory"),
    (b"just some bytes", "Not a gzipped tar archive"),
    (b"", "empty"),
])
def test_an_archive_colony_would_not_unpack_is_refused_in_words(alice, api, data, words):
    response = upload(api(alice), data)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]


def test_an_oversized_archive_is_refused_before_it_is_read(alice, api, monkeypatch):
    monkeypatch.setattr(code, "MAX_BYTES", 1000)
    response = upload(api(alice), tarball({"big.bin": bytes(5000)}) + bytes(1000))
    assert response.status_code == 413
    assert "the most is" in response.json()["error"]["message"]


def test_another_tenants_code_cannot_be_named(alice, api, charlie, vision):
    data = tarball({"secret.py": b"KEY = 'vision-only'\n"})
    sha = upload(api(alice), data).json()["sha256"]
    response = api(charlie).post("/api/v1/jobs/", {"command": ["python", "secret.py"], "gpus": 1, "code": sha},
                                 format="json")
    assert response.status_code == 400
    assert "No code archive" in response.json()["error"]["fields"]["code"][0]
    assert upload(api(charlie), data, tenant="vision").status_code == 400  # nor upload into vision


def test_workdir_environment_and_stop_signal_travel_in_the_launch(alice, api, node1, redis_client,
                                                                  django_capture_on_commit_callbacks):
    response = api(alice).post("/api/v1/jobs/", {
        "command": ["python", "train.py"], "gpus": 1, "workdir": "/shared/alice/proj", "venv": "/shared/venvs/torch",
        "stop_signal": "SIGUSR1", "preempt_grace_s": 60, "checkpoints": True,
    }, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["workdir"], body["venv"], body["stop_signal"], body["checkpoints"]) == \
        ("/shared/alice/proj", "/shared/venvs/torch", "SIGUSR1", True)
    with django_capture_on_commit_callbacks(execute=True):
        run_scheduling_cycle()
    (launch,) = launches(redis_client)
    assert (launch.workdir, launch.venv, launch.conda, launch.image, launch.stop_signal, launch.code) == \
        ("/shared/alice/proj", "/shared/venvs/torch", None, None, "SIGUSR1", None)


@pytest.mark.parametrize("spec, field, words", [
    ({"workdir": "relative/dir"}, "workdir", "absolute path"),
    ({"workdir": "/a", "code": "0" * 64}, "code", "workdir or code, not both"),
    ({"venv": "/v", "conda": "/c"}, "conda", "venv or conda, not both"),
    ({"image": "bad image!"}, "image", "Not an image name"),
    ({"preempt_grace_s": 3000}, "preempt_grace_s", "At most 300 s"),
    ({"stop_signal": "SIGKILL"}, "stop_signal", "not a valid choice"),
])
def test_bad_places_and_environments_are_refused_naming_the_field(alice, api, node1, spec, field, words):
    response = api(alice).post("/api/v1/jobs/", {"command": ["python", "train.py"], "gpus": 1, **spec},
                               format="json")
    assert response.status_code == 400
    assert words in str(response.json()["error"]["fields"][field])
    assert not Job.objects.exists()


def test_an_image_job_is_refused_until_some_node_runs_containers(alice, api, node1):
    job = {"command": ["python", "train.py"], "gpus": 1, "image": "pytorch/pytorch:2.4.0-cuda12.1"}
    refused = api(alice).post("/api/v1/jobs/", job, format="json")
    assert refused.status_code == 400
    assert "No node of this cluster runs containers" in refused.json()["error"]["fields"]["image"][0]
    Node.objects.filter(name="n1").update(runtimes=["docker"])
    assert api(alice).post("/api/v1/jobs/", job, format="json").status_code == 201


def test_a_node_registration_records_its_container_runtimes(db):
    from monitoring.services.registry import register_node

    register_node(protocol.NodeRegistered(
        node="gpu-7", gpus=[protocol.GpuInfo(index=0, uuid="GPU-77", model="A100", memory_mib=81920)],
        backend="simulated", agent_version="1", hostname="gpu-7", runtimes=["podman"]))
    assert Node.objects.get(name="gpu-7").runtimes == ["podman"]


@pytest.fixture
def outsider_tenant_member(db):
    return MembershipFactory(user=UserFactory(username="dora"), tenant=TenantFactory(slug="robotics")).user


def test_a_tenant_keeps_a_bounded_amount_of_code(alice, api, settings):
    settings.COLONY_CODE_STORAGE_MB = 1
    assert upload(api(alice), tarball({"a.bin": os.urandom(700 * 1024)})).status_code == 201
    refused = upload(api(alice), tarball({"b.bin": os.urandom(700 * 1024)}))
    assert refused.status_code == 413
    assert "Tenant vision keeps 0.7 MiB of uploaded code; the most is 1 MiB" in refused.json()["error"]["message"]


def test_uploads_draw_on_the_submission_budget(alice, api, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"submit": "2/min"}}
    client = api(alice)
    assert [upload(client, tarball({f"{n}.py": b"x"})).status_code for n in range(3)] == [201, 201, 429]


def test_code_no_job_needs_is_dropped_and_comes_back_when_uploaded_again(alice, api, vision):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.choices import JobState
    from tests.factories import JobFactory

    client = api(alice)
    old, busy, never = (tarball({f"{name}.py": name.encode()}) for name in ("old", "busy", "never"))
    shas = {name: upload(client, data).json()["sha256"] for name, data in (("old", old), ("busy", busy),
                                                                           ("never", never))}
    archives = {name: code.CodeArchive.objects.get(sha256=sha) for name, sha in shas.items()}
    long_ago = timezone.now() - timedelta(days=40)
    JobFactory(tenant=vision, owner=alice, code=archives["old"], state=JobState.SUCCEEDED, finished_at=long_ago)
    JobFactory(tenant=vision, owner=alice, code=archives["busy"], state=JobState.PENDING)
    code.CodeArchive.objects.filter(pk=archives["never"].pk).update(created_at=long_ago)

    assert code.purge_unused() == 2
    kept = dict(code.CodeArchive.objects.values_list("sha256", "purged_at"))
    assert kept[shas["busy"]] is None and kept[shas["old"]] and kept[shas["never"]]
    refused = client.post("/api/v1/jobs/", {"command": ["python", "old.py"], "gpus": 1, "code": shas["old"]},
                          format="json")
    assert refused.status_code == 400  # its bytes are gone: upload again (colony submit does)
    assert upload(client, old).status_code == 200
    assert bytes(code.CodeArchive.objects.get(sha256=shas["old"]).data) == old


def test_an_archive_that_unpacks_to_a_huge_header_is_refused_without_reading_it_whole(alice, api, monkeypatch):
    monkeypatch.setattr(code, "MAX_UNPACKED_BYTES", 1024 * 1024)
    monkeypatch.setattr(code, "_HEADROOM", 64 * 1024)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("small.py")
        info.size = 1
        info.pax_headers = {"comment": "x" * (8 * 1024 * 1024)}  # 8 MiB of header, a few KiB of gzip
        tar.addfile(info, io.BytesIO(b"x"))
    assert len(buffer.getvalue()) < 64 * 1024
    response = upload(api(alice), buffer.getvalue())
    assert response.status_code == 400
    assert "unpacks to more than 1 MiB" in response.json()["error"]["message"]
