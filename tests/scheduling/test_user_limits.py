"""Per-user limits a tenant lead sets: a member at their most running jobs or GPUs waits (with the
reason and an ETA from their own jobs' ends) while teammates and other tenants go on."""

from dataclasses import replace

from jobs.scheduling import UserLimit, decide
from tests.scheduling.builders import cluster, codes, job, node, pending_of, placed, running, tenant

TENANTS = [tenant("vision", guaranteed=8)]


def mine(j, user="alice"):
    return replace(j, user=user)


def test_a_member_at_their_most_running_jobs_waits_and_a_teammate_does_not():
    snapshot = replace(cluster(
        node("a", gpus=8), tenants=TENANTS,
        running=[running(9, on="a", gpus=[0], runtime=600)],
        pending=[mine(job(1)), mine(job(2)), mine(job(3), user="bob")]),
        user_limits=(UserLimit("vision", "alice", name="alice", max_running=2),))
    snapshot = replace(snapshot, running=(replace(snapshot.running[0], user="alice"),))
    decisions = decide(snapshot, now=100)
    assert set(placed(decisions)) == {1, 3}  # alice had 1 running: one more, then the cap
    assert codes(decisions) == {2: "user_limit"}
    waiting = pending_of(decisions, 2)
    assert "alice has 2 jobs running in vision" in waiting.reason.message
    assert waiting.eta_at == 600.0  # when her running job ends


def test_a_gpu_cap_counts_the_gpus_asked_for():
    snapshot = replace(cluster(node("a", gpus=8), tenants=TENANTS,
                               pending=[mine(job(1, gpus=2)), mine(job(2, gpus=2)), mine(job(3, gpus=1))]),
                       user_limits=(UserLimit("vision", "alice", name="alice", max_gpus=3),))
    decisions = decide(snapshot, now=100)
    assert set(placed(decisions)) == {1, 3}  # 2 + 1 = 3; the second pair would make 5
    assert pending_of(decisions, 2).reason.details["limit"] == "gpus"


def test_limits_of_one_tenant_do_not_touch_a_member_of_the_same_name_elsewhere():
    snapshot = replace(cluster(node("a", gpus=4), tenants=[*TENANTS, tenant("nlp", guaranteed=2)],
                               pending=[mine(job(1, tenant="nlp")), mine(job(2, tenant="nlp"))]),
                       user_limits=(UserLimit("vision", "alice", max_running=0),))
    assert set(placed(decide(snapshot, now=100))) == {1, 2}


def test_a_promised_job_at_its_user_s_limit_takes_one_place_in_their_line_not_two():
    # Alice runs 2 (her cap), ending at 600 and 900. Job 1 holds a promise from an earlier
    # reclaim; job 2 is queued behind it. Each waiting job gets the next of her ends.
    from jobs.scheduling import Promise

    snapshot = replace(cluster(
        node("a", gpus=4), tenants=TENANTS,
        running=[running(8, on="a", gpus=[0], runtime=600), running(9, on="a", gpus=[1], runtime=900)],
        pending=[mine(job(1, submitted_at=1)), mine(job(2, submitted_at=2))]),
        user_limits=(UserLimit("vision", "alice", name="alice", max_running=2),))
    snapshot = replace(snapshot, running=tuple(replace(r, user="alice") for r in snapshot.running),
                       promises=(Promise(1, "vision", (snapshot.nodes[0].gpus[2].id,)),))
    decisions = decide(snapshot, now=100)
    assert codes(decisions) == {1: "user_limit", 2: "user_limit"}
    assert (pending_of(decisions, 1).eta_at, pending_of(decisions, 2).eta_at) == (600.0, 900.0)
