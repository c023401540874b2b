"""The audit log (issue 38): each operator action writes one entry, through the action's real entry
point (API, page, admin, sign-in); operators read the log in the admin and the API, nobody else."""

import pytest

from cluster_ui.models import AuditEvent
from jobs.choices import JobState, Role
from jobs.models import Membership
from monitoring.models import Node
from tests.factories import JobFactory, NodeFactory


def entries(action):
    return list(AuditEvent.objects.filter(action=action))


def test_making_and_revoking_a_token_are_written(api, alice):
    made = api(alice).post("/api/v1/auth/tokens/", {"name": "ci"}, format="json").json()
    [create] = entries("token.create")
    assert (create.actor_name, create.object_id, create.details["name"]) == ("alice", str(made["id"]), "ci")
    api(alice).delete(f"/api/v1/auth/tokens/{made['id']}/")
    [revoke] = entries("token.revoke")
    assert (revoke.actor_name, revoke.details["owner"]) == ("alice", "alice")


def test_an_operator_revoking_someone_elses_token_is_written_as_the_operator(api, alice, operator):
    made = api(alice).post("/api/v1/auth/tokens/", {}, format="json").json()
    api(operator).delete(f"/api/v1/auth/tokens/{made['id']}/")
    [revoke] = entries("token.revoke")
    assert (revoke.actor_name, revoke.details["owner"]) == ("operator", "alice")


def test_an_operator_cancelling_another_users_job_is_written_and_an_owner_cancelling_theirs_is_not(
        api, alice, operator, vision, live_redis):
    mine = JobFactory(tenant=vision, owner=alice)
    theirs = JobFactory(tenant=vision, owner=alice)
    assert api(alice).post(f"/api/v1/jobs/{mine.pk}/cancel/").status_code == 200
    assert entries("job.cancel") == []
    assert api(operator).post(f"/api/v1/jobs/{theirs.pk}/cancel/").status_code == 200
    [cancel] = entries("job.cancel")
    assert (cancel.actor_name, cancel.object_id, cancel.details["owner_id"]) == ("operator", str(theirs.pk), alice.pk)
    theirs.refresh_from_db()
    assert theirs.state == JobState.CANCELLED


def test_bulk_cancel_of_others_jobs_writes_one_entry_each(api, alice, operator, vision, live_redis):
    jobs = [JobFactory(tenant=vision, owner=alice) for _ in range(3)]
    api(operator).post("/api/v1/jobs/cancel/", {"ids": [job.pk for job in jobs]}, format="json")
    assert sorted(int(e.object_id) for e in entries("job.cancel")) == sorted(job.pk for job in jobs)


@pytest.mark.parametrize("action, cordoned_before", [("cordon", False), ("uncordon", True), ("drain", False),
                                                     ("drain_now", False)])
def test_node_actions_in_the_admin_are_written(web, operator, action, cordoned_before):
    node = NodeFactory(name="gpu-07", cordoned=cordoned_before)
    web(operator).post("/admin/monitoring/node/", {"action": action, "_selected_action": [node.pk]})
    [event] = entries(f"node.{action}")
    assert (event.actor_name, event.object_id) == ("operator", "gpu-07")
    assert Node.objects.get(pk=node.pk).cordoned is (action != "uncordon")


def test_a_role_change_in_the_admin_is_written(web, operator, alice, vision):
    membership = Membership.objects.get(user=alice, tenant=vision)
    response = web(operator).post(f"/admin/jobs/membership/{membership.pk}/change/", {
        "user": alice.pk, "tenant": vision.pk, "role": Role.LEAD, "max_gpus": "", "max_running_jobs": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    [event] = entries("admin.change")
    assert (event.actor_name, event.object_type, event.object_id) == ("operator", "jobs.membership", str(membership.pk))
    assert "Role" in event.details["change"]


def form_data(context) -> dict:
    """What the admin change page would post back unchanged: its form and every inline's forms."""
    forms = [context["adminform"].form]
    for inline in context["inline_admin_formsets"]:
        formset = inline.formset
        forms += [formset.management_form, *formset.forms]
    data = {}
    for form in forms:
        for name, field in form.fields.items():
            value = form[name].value()
            if value is None or value is False:
                continue
            data[form.add_prefix(name)] = value
    return data


def test_a_settings_change_in_the_admin_is_written(web, operator, vision):
    page = web(operator).get(f"/admin/jobs/tenant/{vision.pk}/change/")
    data = {**form_data(page.context), "idle_notify_minutes": 45}
    response = web(operator).post(f"/admin/jobs/tenant/{vision.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    [event] = entries("admin.change")
    assert (event.object_type, event.actor_name) == ("jobs.tenant", "operator")
    assert "Idle" in event.details["change"] or "idle" in event.details["change"]


def test_operators_read_the_log_and_nobody_else_does(api, web, alice, operator):
    api(alice).post("/api/v1/auth/tokens/", {}, format="json")
    listed = api(operator).get("/api/v1/audit/").json()
    assert [e["action"] for e in listed["results"]] == ["token.create"]
    assert api(alice).get("/api/v1/audit/").status_code == 404
    assert api().get("/api/v1/audit/").status_code in (401, 403)
    assert web(operator).get("/admin/cluster_ui/auditevent/").status_code == 200
    event = AuditEvent.objects.get()
    assert web(operator).post(f"/admin/cluster_ui/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEvent.objects.count() == 1
