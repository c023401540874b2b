"""Isolation modes in the core: MIG instances serve only their profile, one job at a time; an
unfenced GPU is shared only between jobs that all accept it; fenced GPUs pack as before."""

from jobs.scheduling import decide
from tests.scheduling.builders import classes, cluster, codes, job, node, pending_of, placed, running, tenant

TENANTS = [tenant("vision", guaranteed=2), tenant("nlp", guaranteed=0)]


def gpu_of(decisions, job_id):
    (placement,) = [p for p in decisions.placements if p.job_id == job_id]
    (piece,) = placement.slices
    return piece.node, piece.gpu_indices


def test_a_mig_request_lands_on_an_instance_of_its_profile_and_nothing_else():
    snapshot = cluster(node("whole", gpus=2), node("sliced", gpus=0, mig=("1g.10gb", "3g.40gb")), tenants=TENANTS,
                       pending=[job(1, mig="3g.40gb"), job(2, mig="1g.10gb"), job(3)])
    decisions = decide(snapshot, now=10)
    assert gpu_of(decisions, 1) == ("sliced", (1,))
    assert gpu_of(decisions, 2) == ("sliced", (0,))
    assert placed(decisions)[3] == "whole"  # a plain request never takes a MIG instance


def test_a_whole_gpu_request_does_not_run_on_a_node_that_only_has_mig_instances():
    snapshot = cluster(node("sliced", gpus=0, mig=("1g.10gb",) * 7), tenants=TENANTS, pending=[job(1)])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {}
    assert codes(decisions)[1] == "gpu_model_unavailable"


def test_a_mig_instance_takes_one_job_even_an_opportunistic_one():
    snapshot = cluster(node("sliced", gpus=0, mig=("1g.10gb",)), tenants=TENANTS,
                       running=[running(9, on="sliced", gpus=[0], mem_gib=2, util=0.05, tenant="nlp",
                                        opportunistic=True)],
                       pending=[job(1, mig="1g.10gb", tenant="nlp", mem_gib=1, milli=100)])
    decisions = decide(snapshot, now=10)
    assert placed(decisions) == {}
    assert codes(decisions)[1] != "no_mig_profile"  # it exists; it is busy


def test_a_profile_no_node_has_is_told_which_profiles_exist():
    snapshot = cluster(node("sliced", gpus=0, mig=("1g.10gb", "2g.20gb")), tenants=TENANTS,
                       pending=[job(1, mig="7g.80gb")])
    reason = pending_of(decide(snapshot, now=10), 1).reason
    assert reason.code == "no_mig_profile"
    assert reason.details == {"wanted_profile": "7g.80gb", "online_profiles": ["1g.10gb", "2g.20gb"]}
    assert "1g.10gb, 2g.20gb" in reason.message


def test_a_mig_request_for_more_than_one_device_is_invalid():
    snapshot = cluster(node("sliced", gpus=0, mig=("1g.10gb", "1g.10gb")), tenants=TENANTS,
                       pending=[job(1, gpus=2, mig="1g.10gb")])
    assert codes(decide(snapshot, now=10)) == {1: "invalid_request"}


def shared_candidate(isolation: str, resident_accepts: bool = True, job_accepts: bool = True):
    """One GPU half used by a guaranteed job, a second node with one empty GPU that is busy with
    unknown work: an opportunistic fraction can only go onto the occupied GPU."""
    return cluster(node("a", gpus=1, isolation=isolation),
                   tenants=TENANTS,
                   running=[running(9, on="a", gpus=[0], mem_gib=20, util=0.3, unfenced=resident_accepts)],
                   pending=[job(1, tenant="nlp", milli=300, mem_gib=8, unfenced=job_accepts)])


def test_fenced_gpus_take_a_borrower_next_to_a_guaranteed_job():
    for isolation in ("memory_limit", "mps"):
        decisions = decide(shared_candidate(isolation), now=10)
        assert placed(decisions) == {1: "a"} and classes(decisions) == {1: "opportunistic"}


def test_an_unfenced_gpu_is_shared_only_when_resident_and_newcomer_both_accept():
    assert placed(decide(shared_candidate("unfenced"), now=10)) == {1: "a"}
    assert placed(decide(shared_candidate("unfenced", resident_accepts=False), now=10)) == {}
    assert placed(decide(shared_candidate("unfenced", job_accepts=False), now=10)) == {}


def test_a_refusing_job_placed_this_cycle_keeps_later_borrowers_off_its_unfenced_gpu():
    snapshot = cluster(node("a", gpus=1, isolation="unfenced"), tenants=TENANTS,
                       pending=[job(1, milli=500, mem_gib=8, unfenced=False),
                                job(2, tenant="nlp", milli=300, mem_gib=8, submitted_at=5)])
    assert placed(decide(snapshot, now=10)) == {1: "a"}


def test_a_job_that_refuses_unfenced_sharing_still_takes_an_empty_unfenced_gpu():
    snapshot = cluster(node("a", gpus=1, isolation="unfenced"), tenants=TENANTS,
                       pending=[job(1, unfenced=False)])
    assert placed(decide(snapshot, now=10)) == {1: "a"}


def test_every_request_field_that_shapes_placement_is_in_the_request_key():
    """Jobs with equal request keys share one Shape per cycle: a field that changes the Shape but
    not the key would make a job be placed as if it were another (it did, for mig_profile)."""
    from dataclasses import astuple, fields, replace

    from jobs.scheduling.config import SchedulerConfig
    from jobs.scheduling.queues import request_key as _request_key
    from jobs.scheduling.placement import shape_of
    from jobs.scheduling.snapshot import RecordedProfile

    base = job(1, mem_gib=8)
    changed = {"gpus": 2, "gpu_memory_mib": 1, "gpu_milli": 500, "gpu_models": frozenset({"T4"}), "shareable": True,
               "profile": RecordedProfile(1024, 0.5), "max_nodes": 1, "allreduce_bytes": 7, "needs_runtime": True,
               "cpu_milli": 2000, "host_memory_mb": 512, "mig_profile": "1g.10gb", "accepts_unfenced": False}
    config = SchedulerConfig()
    for field in fields(base):
        variant = replace(base, **{field.name: changed.get(field.name, getattr(base, field.name))})
        if astuple(shape_of(variant, config)) != astuple(shape_of(base, config)):  # Shapes compare by identity
            assert _request_key(variant) != _request_key(base), field.name
    assert {f.name for f in fields(shape_of(base, config))} - {"demand_milli"} <= {
        "gpus", "gpu_milli", "memory_mib", "models", "max_nodes", "shareable", "allreduce_bytes", "needs_runtime",
        "cpu_per_gpu", "host_mb_per_gpu", "mig_profile", "accepts_unfenced", "headroom_mib"}, \
        "a new Shape field needs a line above"


def test_a_tenant_queue_works_out_each_entry_once_per_queue_key_and_gets_every_job_right():
    """``TenantQueues.entries`` makes one entry per ``queue_key`` and hands it to every job of that key
    (it sees every pending job): a field that changes a job's entry but not the key would give the
    job another's entry, and the inlined key must be the one ``queue_key`` spells."""
    from dataclasses import replace

    from jobs.scheduling.carry import QueueColumns
    from jobs.scheduling.config import SchedulerConfig
    from jobs.scheduling.cycle import Cycle
    from jobs.scheduling.queues import queue_key as _queue_key
    from jobs.scheduling.snapshot import RecordedProfile

    base = job(1, mem_gib=8, runtime=60.0)
    changed = {"gpus": 2, "gpu_memory_mib": 1, "gpu_milli": 500, "gpu_models": frozenset({"T4"}), "shareable": True,
               "profile": RecordedProfile(1024, 0.5), "max_nodes": 1, "allreduce_bytes": 7, "needs_runtime": True,
               "cpu_milli": 2000, "host_memory_mb": 512, "mig_profile": "1g.10gb", "accepts_unfenced": False,
               "opportunistic_only": True, "expected_runtime_s": None, "waiting_for": ((1, "ok"),),
               "array_limit": 2, "submitted_at": 2.5}
    variants = [replace(base, id=10 + i, **{name: value}) for i, (name, value) in enumerate(changed.items())]
    twins = [replace(variant, id=100 + variant.id) for variant in variants]  # same key, other jobs
    jobs = [base, *variants, replace(base, id=2), *twins, replace(base, id=3, gpus=10**6)]
    snapshot = cluster(node("a", gpus=8, runtimes=("docker",)), tenants=TENANTS, pending=jobs)
    cycle = Cycle(snapshot, 10.0, SchedulerConfig())
    ceiling = cycle.inputs.quota("vision").ceiling_milli
    queue, waits, _, read = cycle.tenant_queues.entries("vision", ceiling, jobs, {})
    entries = {entry[0].id: entry for entry in queue}
    told = {wait.job_id: wait for wait in waits}
    assert len(entries) + len(told) == len(jobs)
    for one in jobs:  # each job on its own, against the entries made for the whole queue
        alone, alone_waits, _, _ = cycle.tenant_queues.entries("vision", ceiling, [one], {})
        if alone:
            (job_, shape, need, outcome, depends), = alone
            mine = entries[one.id]
            assert (mine[0], mine[1], mine[2], mine[4]) == (one, shape, need, depends), one
            assert (mine[3].shape, mine[3].opportunistic_only) == (outcome.shape, outcome.opportunistic_only)
        else:
            assert [told[one.id]] == alone_waits, one
    # (not in the key: the runtime, the dependencies, the array's limit, the submit time)
    assert len({_queue_key(j) for j in [base, *variants]}) == len(variants) + 1 - 4
    # What it read of the jobs on the way is what the queue's columns read of them afterwards.
    read_after = QueueColumns(queue)
    read_on_the_way = QueueColumns(queue, read)
    assert all(getattr(read_on_the_way, name) == getattr(read_after, name) for name in QueueColumns.__slots__)
