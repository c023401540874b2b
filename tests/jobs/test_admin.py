"""Operator admin: quota audit trail, usage column, node cordon/uncordon/drain, job cancel/resubmit."""

import pytest

from jobs.choices import RunClass, JobState
from jobs.models import Job, JobPromise, QuotaChange, Tenant
from monitoring.models import Node
from tests.factories import JobFactory, TenantFactory, running_job


@pytest.fixture
def vision(db):
    """Guarantee 4 GPUs, ceiling 8: the figures below are read against these."""
    return TenantFactory(slug="vision", guaranteed_gpus=4, max_gpus=8)


@pytest.fixture
def admin(client, operator):
    client.force_login(operator)
    return client


def test_quota_edit_in_the_change_form_is_audited(admin, operator, vision):
    response = admin.post(f"/admin/jobs/tenant/{vision.pk}/change/", {
        "name": vision.name, "slug": "vision", "guaranteed_gpus": "6", "max_gpus": "8", "weight": "1.0",
        "unfenced_sharing": "on",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "quota_changes-TOTAL_FORMS": "0", "quota_changes-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    change = QuotaChange.objects.get()
    assert (change.tenant, change.changed_by, change.field) == (vision, operator, "guaranteed_gpus")
    assert (change.old_value, change.new_value) == ("4", "6")


def test_sharing_and_idle_policy_edits_are_audited_too(admin, operator, vision):
    response = admin.post(f"/admin/jobs/tenant/{vision.pk}/change/", {
        "name": vision.name, "slug": "vision", "guaranteed_gpus": "4", "max_gpus": "8", "weight": "1.0",
        "idle_requeue_minutes": "120",  # and unfenced_sharing left unticked: turned off
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "quota_changes-TOTAL_FORMS": "0", "quota_changes-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else response
    changes = {(c.field, c.old_value, c.new_value) for c in QuotaChange.objects.filter(changed_by=operator)}
    assert changes == {("unfenced_sharing", "True", "False"), ("idle_requeue_minutes", "None", "120")}
    page = admin.get(f"/admin/jobs/tenant/{vision.pk}/change/").content.decode()
    assert "Quota changes (audit trail)" in page and "guaranteed_gpus" in page


def test_quota_edit_in_the_list_is_audited(admin, vision, nlp):
    tenants = [vision, nlp]
    data = {"form-TOTAL_FORMS": "2", "form-INITIAL_FORMS": "2", "_save": "Save", "action": ""}
    for n, tenant in enumerate(tenants):
        data |= {f"form-{n}-id": str(tenant.pk), f"form-{n}-guaranteed_gpus": str(tenant.guaranteed_gpus),
                 f"form-{n}-max_gpus": str(tenant.max_gpus), f"form-{n}-weight": str(tenant.weight)}
    data |= {"form-1-max_gpus": "10", "form-1-weight": "2.5"}
    assert admin.post("/admin/jobs/tenant/", data).status_code == 302
    assert Tenant.objects.get(slug="nlp").max_gpus == 10
    changes = {(c.tenant.slug, c.field, c.old_value, c.new_value) for c in QuotaChange.objects.all()}
    assert changes == {("nlp", "max_gpus", "6", "10"), ("nlp", "weight", "1.0", "2.5")}
    audit = admin.get("/admin/jobs/quotachange/").content.decode()
    assert "max_gpus" in audit and "weight" in audit


def test_tenant_list_shows_usage_against_quota(admin, alice, vision, cluster):
    running_job(vision, alice, [cluster["a1/0"], cluster["a1/1"]])
    running_job(vision, alice, [cluster["a1/2"]], milli=500, run_class=RunClass.OPPORTUNISTIC)
    page = admin.get("/admin/jobs/tenant/").content.decode()
    assert "2 + 0.5 / 4 / 8 GPUs" in page


def test_cordon_uncordon_and_drain_nodes(admin, cluster):
    def act(action, *names):
        ids = [str(Node.objects.get(name=name).pk) for name in names]
        return admin.post("/admin/monitoring/node/", {"action": action, "_selected_action": ids}, follow=True)

    act("cordon", "a1")
    assert Node.objects.get(name="a1").cordoned
    act("uncordon", "a1")
    assert not Node.objects.get(name="a1").cordoned
    page = act("drain", "a1", "v1").content.decode()
    assert all(node.cordoned for node in Node.objects.all())
    assert "Draining a1, v1" in page
    assert admin.get("/admin/monitoring/node/").status_code == 200


def test_cancel_and_resubmit_jobs_from_the_admin(admin, alice, vision):
    pending = JobFactory(tenant=vision, owner=alice)
    finished = JobFactory(tenant=vision, owner=alice, state=JobState.FAILED, gpu_memory_mib=1000, priority=2)
    page = admin.post("/admin/jobs/job/", {"action": "cancel_jobs", "_selected_action": [pending.pk, finished.pk]},
                      follow=True).content.decode()
    assert Job.objects.get(pk=pending.pk).state == JobState.CANCELLED
    assert "Cancelled or stopping 1 job(s)" in page and "Not cancelled" in page
    admin.post("/admin/jobs/job/", {"action": "resubmit_jobs", "_selected_action": [finished.pk]})
    copy = Job.objects.exclude(pk__in=[pending.pk, finished.pk]).get()
    assert (copy.state, copy.gpu_memory_mib, copy.priority, copy.owner) == (JobState.PENDING, 1000, 2, alice)


def test_an_operator_sees_the_gpus_promised_to_a_reclaiming_job_and_cannot_edit_them(admin, alice, vision):
    job = JobFactory(tenant=vision, owner=alice)
    JobPromise.objects.create(job=job, gpu_ids=[4711, 4712])
    page = admin.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    assert "Promised GPUs" in page.content.decode() and "[4711, 4712]" in page.content.decode()
    assert "promised_gpus" not in page.context["adminform"].form.fields


@pytest.mark.parametrize("path", ["/admin/jobs/quotachange/", "/admin/jobs/tenant/add/", "/admin/monitoring/alert/",
                                  "/admin/monitoring/jobusage/", "/admin/monitoring/gpu/"])
def test_admin_pages_load(admin, cluster, path):
    assert admin.get(path).status_code == 200


def test_requeue_from_the_admin_stops_a_running_job_and_queues_it_again(admin, alice, vision, cluster,
                                                                         redis_client, live_redis,
                                                                         django_capture_on_commit_callbacks):
    from agents import protocol
    from jobs.services.agent_events import consume_events

    gpu = cluster["a1/0"]
    job = running_job(vision, alice, [gpu])
    pending = JobFactory(tenant=vision, owner=alice)
    with django_capture_on_commit_callbacks(execute=True):
        page = admin.post("/admin/jobs/job/", {"action": "requeue_jobs", "_selected_action": [job.pk, pending.pk]},
                          follow=True).content.decode()
    assert "Requeueing 1 job(s)" in page and "only placed or running jobs can be requeued" in page
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and job.requeue_count == 1
    [(_, fields)] = redis_client.xrange(protocol.command_stream(gpu.node.name))
    stop = protocol.decode_command(fields)
    assert (stop.kind, stop.job_id) == ("stop", job.pk)
    # The node reports the stop: the job is back in the queue, its GPU free.
    redis_client.xadd(protocol.EVENTS_STREAM, protocol.encode(protocol.JobExited(
        node=gpu.node.name, job_id=job.pk, exit_code=-15, stopped=True, finished_at=0)))
    consume_events(redis_client)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not job.allocations.filter(released_at__isnull=True).exists()


def test_drain_now_cordons_and_requeues_what_runs_there(admin, alice, vision, cluster, redis_client, live_redis,
                                                        django_capture_on_commit_callbacks):
    on_a1 = running_job(vision, alice, [cluster["a1/0"], cluster["a1/1"]])
    on_v1 = running_job(vision, alice, [cluster["v1/0"]])
    with django_capture_on_commit_callbacks(execute=True):
        page = admin.post("/admin/monitoring/node/", {"action": "drain_now",
                                                      "_selected_action": [Node.objects.get(name="a1").pk]},
                          follow=True).content.decode()
    assert f"requeued 1 running job(s) (#{on_a1.pk})" in page
    assert Node.objects.get(name="a1").cordoned and not Node.objects.get(name="v1").cordoned
    states = dict(Job.objects.values_list("pk", "state"))
    assert (states[on_a1.pk], states[on_v1.pk]) == (JobState.PREEMPTING, JobState.RUNNING)
