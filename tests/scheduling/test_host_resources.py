"""CPU cores and host memory: a node's GPUs are only offered while its CPU and RAM can feed them,
and a job kept off free GPUs by them is told which one."""

from jobs.scheduling import decide
from tests.scheduling.builders import cluster, codes, job, node, pending_of, placed, preempted, running, tenant

TENANTS = [tenant("vision", guaranteed=8)]


def test_job_lands_on_the_node_with_cpu_for_it():
    snapshot = cluster(node("small", gpus=4, cpus=4), node("big", gpus=4, cpus=64), tenants=TENANTS,
                       pending=[job(1, cpus=16)])
    assert placed(decide(snapshot, now=10)) == {1: "big"}


def test_running_jobs_requests_use_up_a_nodes_cpu_and_this_cycles_placements_count_too():
    snapshot = cluster(node("a", gpus=8, cpus=32), tenants=TENANTS,
                       running=[running(9, on="a", gpus=[0], cpus=16)],
                       pending=[job(1, cpus=8), job(2, cpus=8), job(3, cpus=8)])
    decisions = decide(snapshot, now=10)
    assert set(placed(decisions)) == {1, 2}  # 16 of 32 cores were taken; 8 + 8 fill the rest
    assert codes(decisions) == {3: "insufficient_cpu"}
    reason = pending_of(decisions, 3).reason
    assert "8 CPU cores" in reason.message and reason.details["resource"] == "cpu"


def test_host_memory_is_a_constraint_of_its_own():
    snapshot = cluster(node("a", gpus=4, cpus=64, ram_gib=64), tenants=TENANTS,
                       running=[running(9, on="a", gpus=[0], ram_gib=48)],
                       pending=[job(1, ram_gib=32)])
    decisions = decide(snapshot, now=10)
    assert codes(decisions) == {1: "insufficient_host_memory"}
    assert "32 GiB of host memory" in pending_of(decisions, 1).reason.message


def test_a_gang_spreads_in_proportion_to_what_each_node_can_feed():
    # 8 GPUs asking 64 cores = 8 per GPU: node a feeds only 2 of its 4 free GPUs, so b and c take the rest.
    snapshot = cluster(node("a", gpus=4, cpus=16), node("b", gpus=4, cpus=64), node("c", gpus=4, cpus=64),
                       tenants=TENANTS, pending=[job(1, gpus=8, cpus=64)])
    (place,) = decide(snapshot, now=10_000).placements
    per_node = {s.node: len(s.gpu_indices) for s in place.slices}
    assert per_node == {"b": 4, "c": 4}


def test_request_more_cpu_than_any_node_has_is_told_it_can_never_run():
    snapshot = cluster(node("a", gpus=8, cpus=32), tenants=TENANTS, pending=[job(1, cpus=48)])
    decisions = decide(snapshot, now=10)
    assert codes(decisions) == {1: "no_node_with_enough_cpu"}
    assert pending_of(decisions, 1).reason.details == {"resource": "cpu", "needed": 48000, "largest_node": 32000}


def test_a_spread_gang_may_ask_more_cpu_than_one_node_has():
    snapshot = cluster(node("a", gpus=4, cpus=32), node("b", gpus=4, cpus=32), tenants=TENANTS,
                       pending=[job(1, gpus=8, cpus=48)])
    decisions = decide(snapshot, now=10_000)
    assert placed(decisions) == {1: "a"} and len(decisions.placements[0].slices) == 2


def test_nodes_that_do_not_report_cpu_never_run_short():
    snapshot = cluster(node("a", gpus=2), tenants=TENANTS, pending=[job(1, cpus=500), job(2, ram_gib=4096)])
    assert set(placed(decide(snapshot, now=10))) == {1, 2}


def test_reclaim_frees_the_borrowers_cpu_with_their_gpus():
    snapshot = cluster(node("a", gpus=2, cpus=16), tenants=[tenant("owner", guaranteed=2, max_gpus=2),
                                                             tenant("borrower", max_gpus=8)],
                       running=[running(9, on="a", gpus=[0, 1], tenant="borrower", opportunistic=True, cpus=16)],
                       pending=[job(1, tenant="owner", gpus=2, cpus=16)])
    decisions = decide(snapshot, now=100)
    assert preempted(decisions) == [9]
    assert codes(decisions) == {1: "reclaiming"}


def test_reclaim_skips_a_node_whose_cpu_its_victims_would_not_free():
    # The borrower holds the GPUs but a guaranteed job on the other GPU holds the CPU: evicting the
    # borrower would not let the owner's job start, so nobody is evicted.
    snapshot = cluster(node("a", gpus=3, cpus=16), tenants=[tenant("owner", guaranteed=3, max_gpus=3),
                                                             tenant("borrower", max_gpus=8)],
                       running=[running(8, on="a", gpus=[2], tenant="owner", cpus=12),
                                running(9, on="a", gpus=[0, 1], tenant="borrower", opportunistic=True)],
                       pending=[job(1, tenant="owner", gpus=2, cpus=8)])
    decisions = decide(snapshot, now=100)
    assert preempted(decisions) == []


def test_a_one_gpu_job_leaves_the_only_node_with_cpu_for_a_queued_8_gpu_job_whole():
    # Only "wide" has the 120 cores job 2 asks; the 1-GPU job would strand fewer GPUs there (the
    # others' free GPUs need the CPU it takes), but breaking "wide" would leave job 2 no node at all.
    full = [node(f"full{i}", gpus=8, cpus=96) for i in range(3)]
    snapshot = cluster(node("narrow0", gpus=8, cpus=96), node("wide", gpus=8, cpus=128),
                       node("narrow1", gpus=8, cpus=96), *full, tenants=TENANTS,
                       running=[running(100 + 8 * i + g, on=f"full{i}", gpus=[g], cpus=12)
                                for i in range(3) for g in range(8)],
                       pending=[job(1, cpus=24), job(2, gpus=8, cpus=120)])
    decisions = decide(snapshot, now=10)
    assert placed(decisions)[2] == "wide"
    assert placed(decisions)[1].startswith("narrow")
