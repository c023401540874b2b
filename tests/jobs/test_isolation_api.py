"""Isolation from the researcher's side: asking for a MIG instance (accepted, or refused in words
that say why), consenting or not to share GPUs that fence nothing, and what the scheduler and the
nodes are told. Submissions go through POST /api/v1/jobs/, placements through the real scheduling
cycle, launches are read back from the node's command stream."""

from __future__ import annotations

import pytest

from agents import protocol
from jobs.choices import JobState, RunClass
from jobs.models import Allocation, Job
from jobs.services.scheduling_loop import run_scheduling_cycle
from monitoring.services.registry import register_node
from tests.factories import GpuFactory, JobFactory, NodeFactory, TenantFactory, UserFactory, running_job


def mig_node(name="mig-1", profiles=("1g.10gb", "1g.10gb", "3g.40gb")):
    """A node whose GPU 0 is split into MIG instances, registered as its agent would."""
    memory = {"1g.10gb": 9984, "3g.40gb": 40192}
    return register_node(protocol.NodeRegistered(
        node=name, hostname=name, backend="nvml", agent_version="t",
        gpus=[protocol.GpuInfo(index=i, uuid=f"MIG-{name}-{i}", model="H100-80GB", memory_mib=memory[profile],
                               isolation="mig", mig_profile=profile, parent_index=0)
              for i, profile in enumerate(profiles)]))


def whole_node(name="a1", gpus=2, isolation="mps"):
    return register_node(protocol.NodeRegistered(
        node=name, hostname=name, backend="nvml", agent_version="t",
        gpus=[protocol.GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="A100-80GB", memory_mib=81920,
                               isolation=isolation) for i in range(gpus)]))


def submit(api, user, **body):
    return api(user).post("/api/v1/jobs/", {"command": ["python", "train.py"], "gpus": 1, **body}, format="json")


def field_errors(response) -> dict:
    return response.json()["error"]["fields"]


# -- MIG requests at submission ---------------------------------------------------------------------


def test_a_mig_profile_some_node_has_is_accepted_and_shown(api, alice):
    mig_node()
    whole_node()
    response = submit(api, alice, mig_profile="1g.10gb")
    assert response.status_code == 201, response.json()
    assert response.json()["mig_profile"] == "1g.10gb"
    assert Job.objects.get(pk=response.json()["id"]).mig_profile == "1g.10gb"


def test_a_mig_profile_no_node_has_is_refused_naming_the_ones_there_are(api, alice):
    mig_node()
    response = submit(api, alice, mig_profile="2g.20gb")
    assert response.status_code == 400
    assert field_errors(response)["mig_profile"] == [
        "No node has a MIG instance of profile 2g.20gb; the cluster's MIG profiles: 1g.10gb, 3g.40gb."]
    assert not Job.objects.exists()


def test_a_mig_profile_on_a_cluster_without_mig_says_so(api, alice):
    whole_node()
    response = submit(api, alice, mig_profile="1g.10gb")
    assert response.status_code == 400
    assert "none (no GPU is in MIG mode)" in field_errors(response)["mig_profile"][0]


@pytest.mark.parametrize("body, field, words", [
    ({"gpus": 2}, "mig_profile", "runs on one MIG instance: ask for gpus=1, not 2"),
    ({"gpu_milli": 500}, "gpu_milli", "A MIG instance is not shared: leave gpu_milli at 1000"),
    ({"mig_profile": "big"}, "mig_profile", "'big' is not a MIG profile"),
    ({"gpu_memory_mib": 20000}, "gpu_memory_mib", "No MIG instance of profile 1g.10gb has 20000 MiB; the largest "
                                                  "has 9984 MiB."),
])
def test_a_mig_request_that_could_never_run_is_refused(api, alice, body, field, words):
    mig_node()
    response = submit(api, alice, **{"mig_profile": "1g.10gb", **body})
    assert response.status_code == 400
    assert words in " ".join(field_errors(response)[field])


def test_whole_gpu_jobs_on_an_all_mig_cluster_are_told_to_ask_for_an_instance(api, alice):
    mig_node()
    response = submit(api, alice)
    assert response.status_code == 400
    assert "give mig_profile (one of 1g.10gb, 3g.40gb)" in field_errors(response)["mig_profile"][0]


def test_the_submit_page_refuses_a_missing_profile_in_the_api_words(web, alice):
    mig_node()
    whole_node()
    page = web(alice).post("/jobs/submit/", {"command": "python train.py", "gpus": "1", "gpu_milli": "1000",
                                             "mig_profile": "7g.80gb", "run_as": "auto"})
    assert page.status_code == 200
    assert "No node has a MIG instance of profile 7g.80gb" in page.content.decode()
    assert not Job.objects.exists()


def test_the_submit_page_offers_the_cluster_mig_profiles_and_takes_the_consent(web, alice):
    mig_node()
    whole_node()
    form = web(alice).get("/jobs/submit/").content.decode()
    assert '<option value="3g.40gb">3g.40gb (39 GiB)</option>' in form
    page = web(alice).post("/jobs/submit/", {"command": "python train.py", "gpus": "1", "gpu_milli": "1000",
                                             "mig_profile": "1g.10gb", "accepts_unfenced": "no", "run_as": "auto"})
    assert page.status_code == 302, page.content.decode()[:2000]
    job = Job.objects.get()
    assert (job.mig_profile, job.accepts_unfenced) == ("1g.10gb", False)


# -- consent to share unfenced GPUs --------------------------------------------------------------------


def test_consent_defaults_to_the_tenant_and_can_be_refused_per_job(api, alice, vision):
    whole_node()
    default = submit(api, alice).json()
    refused = submit(api, alice, accepts_unfenced=False).json()
    assert (default["accepts_unfenced"], refused["accepts_unfenced"]) == (None, False)
    tenant = api(alice).get("/api/v1/tenants/vision/").json()
    assert tenant["unfenced_sharing"] is True


def test_researchers_cannot_change_their_tenant_consent_operators_can(api, web, alice, operator, vision):
    assert api(alice).patch("/api/v1/tenants/vision/", {"unfenced_sharing": False}, format="json").status_code == 405
    vision.refresh_from_db()
    assert vision.unfenced_sharing is True
    response = web(operator).post(f"/admin/jobs/tenant/{vision.pk}/change/", {
        "name": vision.name, "slug": "vision", "guaranteed_gpus": str(vision.guaranteed_gpus),
        "max_gpus": str(vision.max_gpus), "weight": "1.0",  # the consent box left unticked
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "quota_changes-TOTAL_FORMS": "0", "quota_changes-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302
    vision.refresh_from_db()
    assert vision.unfenced_sharing is False
    assert api(alice).get("/api/v1/tenants/vision/").json()["unfenced_sharing"] is False


def test_the_job_page_shows_the_mig_profile_and_the_consent_in_force(web, alice, vision):
    vision.unfenced_sharing = False
    vision.save()
    mig = JobFactory(tenant=vision, owner=alice, mig_profile="1g.10gb")
    page = web(alice).get(f"/jobs/{mig.pk}/").content.decode()
    assert "a MIG instance of profile <code>1g.10gb</code>, to itself" in page
    assert "never shares one <span class=\"muted\">(tenant vision's setting)</span>" in page
    willing = JobFactory(tenant=vision, owner=alice, accepts_unfenced=True)
    assert "may share one</dd>" in web(alice).get(f"/jobs/{willing.pk}/").content.decode()


# -- what the scheduler does with it -------------------------------------------------------------------


@pytest.fixture
def online(redis_client, live_redis):
    def mark(*names):
        for name in names:
            redis_client.set(protocol.heartbeat_key(name), "{}", ex=60)
    return mark


def launches(redis_client, node):
    return [command for _, fields in redis_client.xrange(protocol.command_stream(node))
            if isinstance(command := protocol.decode_command(fields), protocol.LaunchJob)]


def cycle(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        return run_scheduling_cycle()


def test_a_fractional_job_is_launched_with_its_compute_share_a_whole_one_without(
        db, online, redis_client, django_capture_on_commit_callbacks):
    whole_node("n1", gpus=2)
    online("n1")
    quarter = JobFactory(gpu_milli=250, gpu_memory_mib=10000)
    whole = JobFactory()
    cycle(django_capture_on_commit_callbacks)
    by_job = {launch.job_id: launch for launch in launches(redis_client, "n1")}
    assert by_job[quarter.pk].compute_share == 0.25
    assert by_job[whole.pk].compute_share is None


def test_a_mig_job_runs_on_an_instance_of_its_profile_alone(db, online, redis_client,
                                                            django_capture_on_commit_callbacks):
    mig_node("m1", profiles=("1g.10gb", "3g.40gb"))
    whole_node("a1", gpus=1)
    online("m1", "a1")
    small = JobFactory(mig_profile="1g.10gb")
    second = JobFactory(mig_profile="1g.10gb")
    plain = JobFactory()
    cycle(django_capture_on_commit_callbacks)
    placed = {a.job_id: a.gpu for a in Allocation.objects.select_related("gpu__node")}
    assert (placed[small.pk].node.name, placed[small.pk].mig_profile) == ("m1", "1g.10gb")
    assert placed[plain.pk].node.name == "a1"  # never on the idle 3g.40gb instance
    second.refresh_from_db()  # the only 1g.10gb instance is taken, and an instance takes one job
    assert second.state == JobState.PENDING
    (launch,) = launches(redis_client, "m1")
    assert (launch.job_id, launch.gpu_indices) == (small.pk, [0])


def test_a_tenant_changing_its_consent_reaches_its_waiting_and_running_jobs_next_cycle(db, redis_client, alice,
                                                                                        vision):
    from jobs.services.snapshot_loader import build_snapshot

    waiting = JobFactory(tenant=vision, owner=alice)
    own_mind = JobFactory(tenant=vision, owner=alice, accepts_unfenced=True)
    running = running_job(vision, alice, [GpuFactory(isolation="unfenced")])

    def consent(snapshot):
        return ({job.id: job.accepts_unfenced for job in snapshot.pending},
                {job.id: job.accepts_unfenced for job in snapshot.running})

    assert consent(build_snapshot(redis_client)) == ({waiting.pk: True, own_mind.pk: True}, {running.pk: True})
    vision.unfenced_sharing = False
    vision.save()
    assert consent(build_snapshot(redis_client)) == ({waiting.pk: False, own_mind.pk: True}, {running.pk: False})


@pytest.fixture
def unfenced_gpu_with_a_guaranteed_job(db, online):
    """Node ``u``: one unfenced GPU where vision's guaranteed job runs (half of it, 20 GiB)."""
    node = NodeFactory(name="u")
    gpu = GpuFactory(node=node, index=0, uuid="GPU-u-0", isolation="unfenced")
    vision = TenantFactory(slug="vision", guaranteed_gpus=1, max_gpus=1)
    resident = running_job(vision, UserFactory(), [gpu], milli=750, gpu_memory_mib=20000)
    online("u")
    return resident


def borrower(**fields):
    return JobFactory(tenant=TenantFactory(slug="nlp", guaranteed_gpus=0, max_gpus=4), gpu_milli=250,
                      gpu_memory_mib=10000, opportunistic_only=True, **fields)


def fenced_node(online, busy: bool):
    """Node ``f``: one GPU with MPS; ``busy``: a whole job holds it, so nothing can join."""
    gpu = GpuFactory(node=NodeFactory(name="f"), index=0, uuid="GPU-f-0", isolation="mps")
    if busy:
        running_job(TenantFactory(slug="ops", guaranteed_gpus=1, max_gpus=1), UserFactory(), [gpu])
    online("f")
    return gpu


@pytest.mark.parametrize("tenant_consents, lands_on", [(True, "u"), (False, "f")])
def test_a_borrower_is_packed_next_to_a_guaranteed_job_on_an_unfenced_gpu_only_if_its_tenant_consents(
        unfenced_gpu_with_a_guaranteed_job, online, redis_client, django_capture_on_commit_callbacks,
        tenant_consents, lands_on):
    """Packing prefers a GPU already in use (whole GPUs stay free for gangs): with consent the
    borrower joins vision's job on ``u``; without it the empty fenced GPU on ``f`` takes it."""
    resident = unfenced_gpu_with_a_guaranteed_job
    resident.tenant.unfenced_sharing = tenant_consents
    resident.tenant.save()
    fenced_node(online, busy=False)
    job = borrower()
    cycle(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    assert job.state == JobState.PLACED, job.pending_reason
    assert Allocation.objects.get(job=job).gpu.node.name == lands_on
    assert not [launch for launch in launches(redis_client, "u" if lands_on == "f" else "f")]
    (launch,) = launches(redis_client, lands_on)
    assert (launch.job_id, launch.compute_share) == (job.pk, 0.25)


@pytest.mark.parametrize("tenant_consents, job_consents, packed", [
    (True, None, True),     # today's behaviour: both accept, the borrower joins the guaranteed job
    (False, None, False),   # the resident's tenant refuses
    (True, False, False),   # the borrower itself refuses
    (False, True, False),   # the borrower accepting does not override the resident's refusal
])
def test_an_unfenced_gpu_is_shared_only_when_every_job_on_it_accepts(
        unfenced_gpu_with_a_guaranteed_job, online, redis_client, django_capture_on_commit_callbacks,
        tenant_consents, job_consents, packed):
    resident = unfenced_gpu_with_a_guaranteed_job
    resident.tenant.unfenced_sharing = tenant_consents
    resident.tenant.save()
    fenced_node(online, busy=True)  # the only other GPU is full: the unfenced one is the borrower's one chance
    job = borrower(accepts_unfenced=job_consents)
    cycle(django_capture_on_commit_callbacks)
    job.refresh_from_db()
    if packed:
        assert job.state == JobState.PLACED, job.pending_reason
        assert Allocation.objects.get(job=job).gpu == Allocation.objects.get(job=resident).gpu
        assert job.run_class == RunClass.OPPORTUNISTIC
    else:
        assert job.state == JobState.PENDING
        assert not Allocation.objects.filter(job=job).exists()


# -- the command line ------------------------------------------------------------------------------


def cli_body(*flags):
    from cluster_ui.cli import submit as cli_submit
    from cluster_ui.cli.main import build_parser

    args = build_parser().parse_args(["submit", *flags, "--", "python", "train.py"])
    args.command, args.gpus_given, args.gpus = args.command[1:], args.gpus is not None, args.gpus or 1
    return cli_submit.job_body(args)


def test_colony_submit_sends_the_mig_profile_and_the_refusal_and_the_api_takes_them(api, alice):
    mig_node()
    body = cli_body("--mig-profile", "1g.10gb", "--no-unfenced")
    assert (body["mig_profile"], body["accepts_unfenced"]) == ("1g.10gb", False)
    assert "accepts_unfenced" not in cli_body()  # unsaid: the tenant's setting
    job = submit(api, alice, **{k: v for k, v in body.items() if k != "name"}).json()
    assert (job["mig_profile"], job["accepts_unfenced"]) == ("1g.10gb", False)


def test_colony_submit_refuses_a_mig_profile_with_several_gpus_or_a_fraction():
    from cluster_ui.cli.client import Usage

    for flags in (("--gpus", "2"), ("--gpu-fraction", "0.5")):
        with pytest.raises(Usage, match="--mig-profile runs the job on one MIG instance"):
            cli_body("--mig-profile", "1g.10gb", *flags)
