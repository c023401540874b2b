"""Reading the public traces: tenants, slices, classes, fractions and what is left out."""

import pytest

from jobs.scheduling.simulate.loaders import TRACES_DIR, load_alibaba, load_alibaba_nodes, load_philly, synthetic_usage

pytestmark = pytest.mark.skipif(not TRACES_DIR.is_dir(), reason=f"public traces not found at {TRACES_DIR}")


def test_philly_slice_uses_the_virtual_cluster_as_tenant_and_starts_at_zero():
    trace = load_philly(nodes=4, first=50)
    assert len(trace.jobs) == 50
    assert trace.jobs[0].submit_s == 0.0
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)
    assert {j.tenant for j in trace.jobs} <= {"103959", "11cb48", "2869ce", "6214e9", "6c71a0", "7f04ca", "b436b2",
                                              "e13805", "ed69ec", "ee9e8c", "0e4a51", "4b3d7b", "51b7ef", "795a4c",
                                              "925e2b"}
    assert trace.total_gpus == 32


def test_philly_guarantees_split_evenly_over_every_virtual_cluster_by_default():
    # 15 virtual clusters in the whole trace, whoever submits in the slice.
    trace = load_philly(nodes=8, first=50)
    assert len(trace.quotas) == 15 and sum(q.guaranteed_gpus for q in trace.quotas) == trace.total_gpus
    assert max(q.guaranteed_gpus for q in trace.quotas) - min(q.guaranteed_gpus for q in trace.quotas) <= 1


def test_alibaba_nodes_and_pods_carry_cpu_and_host_memory():
    trace = load_alibaba(nodes=4, first=50)
    assert all(n.cpu_milli > 0 and n.host_memory_mb > 0 for n in trace.nodes)
    assert all(j.cpu_milli > 0 for j in trace.jobs)


def test_a_pod_list_without_timestamps_is_untimed_and_has_no_made_up_duration():
    trace = load_alibaba("multigpu50", nodes=4, first=20)
    assert not trace.timed and all(j.duration_s == float("inf") for j in trace.jobs)


def test_philly_guarantees_follow_demand_and_add_up_to_the_cluster_on_request():
    trace = load_philly(nodes=8, first=400, quotas="demand")
    assert sum(q.guaranteed_gpus for q in trace.quotas) == trace.total_gpus
    demand = {}
    for job in trace.jobs:
        demand[job.tenant] = demand.get(job.tenant, 0) + job.gpu_seconds
    biggest = max(demand, key=demand.get)
    assert max(trace.quotas, key=lambda q: q.guaranteed_gpus).name == biggest


def test_jobs_wider_than_the_cluster_are_left_out_and_counted():
    trace = load_philly(nodes=1, gpus_per_node=8, first=2000)
    assert all(job.gpus <= 8 for job in trace.jobs)
    assert trace.skipped.get("needs more GPUs than the cluster has", 0) > 0


def test_philly_hours_window_keeps_only_jobs_submitted_in_it():
    trace = load_philly(nodes=4, skip=1000, hours=2)
    assert trace.jobs and max(j.submit_s for j in trace.jobs) < 2 * 3600


def test_synthetic_usage_is_reproducible_and_changes_with_the_seed():
    assert synthetic_usage("philly:7", 32768) == synthetic_usage("philly:7", 32768)
    draws = {synthetic_usage(f"philly:{i}", 32768, seed=1) for i in range(200)}
    assert len(draws) > 150
    assert all(0 < util <= 1 and 0 < memory <= 32768 for util, memory in draws)
    heavy = sum(1 for util, _ in draws if util > 0.8)
    assert 0.05 < heavy / len(draws) < 0.3  # AntMan: few GPUs run hot


def test_alibaba_maps_qos_fractions_and_skips_cpu_only_pods():
    trace = load_alibaba(nodes=40, first=500)
    assert trace.skipped["CPU-only pod"] > 0
    fractional = [j for j in trace.jobs if j.gpu_milli < 1000]
    assert fractional and all(j.gpus == 1 and j.memory_mib is None and j.utilisation == j.gpu_milli / 1000
                              for j in fractional)
    assert any(j.opportunistic_only for j in trace.jobs)  # BE pods
    assert any(not j.opportunistic_only for j in trace.jobs)  # LS pods
    assert len(trace.tenants) == 4


def test_alibaba_node_subset_keeps_the_mix_of_models():
    every = load_alibaba_nodes()
    subset = load_alibaba_nodes(nodes=100)
    assert len(every) == 1213 and sum(n.gpus for n in every) == 6212
    assert len(subset) == 100
    assert {n.model for n in subset} >= {"G2", "T4", "P100"}
