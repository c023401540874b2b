"""The packing baselines and the fill protocol follow FGD's simulator
(hkust-adsl/kubernetes-scheduler-simulator): its arrival, its scores, its typical pods, its reading."""

import pytest

from jobs.scheduling.decisions import Decisions
from jobs.scheduling.policies import POLICIES
from jobs.scheduling.policies.binpack import Protocol
from jobs.scheduling.fragmentation import Workload
from jobs.scheduling.simulate import fill, loaders, published
from jobs.scheduling.simulate.trace import NodeSpec, TraceJob
from tests.scheduling.builders import cluster, job, node

GIB = 1024


def pod(id, milli=1000, gpus=1, cpu=1000, memory_mib=None, tenant="t"):
    return TraceJob(id=id, tenant=tenant, submit_s=0.0, duration_s=100.0, gpus=gpus, gpu_milli=milli,
                    memory_mib=memory_mib, utilisation=milli / 1000, cpu_milli=cpu)


def t4_nodes(count, gpus=2, cpu=32000, gpu_gib=16, prefix="n"):
    return tuple(NodeSpec(f"{prefix}{i}", gpus, "T4", gpu_gib * GIB, cpu_milli=cpu, host_memory_mb=256 * GIB)
                 for i in range(count))


def placed_on(decisions: Decisions) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {p.job_id: (p.slices[0].node, p.slices[0].gpu_indices) for p in decisions.placements}


def test_best_fit_scores_absolute_free_resources_not_the_node_share():
    # Relative to each node, the 8-GPU node is the fuller one (nothing left of its GPUs, 90% of its CPU);
    # FGD's BestFit counts what is left against the largest node (128 CPUs, 8 GPUs), so the small
    # node with 12 CPUs and one GPU left after placing is the tighter fit.
    snapshot = cluster(node("big", gpus=8, busy=7, model="T4", cpus=90), node("small", gpus=2, model="T4", cpus=16),
                       pending=[job(1, cpus=4)])
    assert placed_on(Protocol("best_fit", None, seed=0)(snapshot, 0.0)) == {1: ("small", (0,))}


def test_best_fit_and_gpu_packing_put_a_share_on_the_tightest_gpu_of_the_node():
    snapshot = cluster(node("a", gpus=3, model="T4", cpus=64),
                       pending=[job(1, milli=300, cpus=1), job(2, milli=500, cpus=1)])
    for name in ("best_fit", "gpu_packing"):
        decisions = Protocol(name, None, seed=0)(snapshot, 0.0)
        # The second share joins the GPU the first left at 700 free, not an empty one.
        assert placed_on(decisions) == {1: ("a", (0,)), 2: ("a", (0,))}, name


def test_gpu_packing_prefers_a_used_gpu_then_a_used_node_then_the_smallest_idle_node():
    idle_big, idle_small = node("big", gpus=8, model="T4", cpus=64), node("small", gpus=2, model="T4", cpus=64)
    used = node("used", gpus=4, busy=1, model="T4", cpus=64)
    packing = Protocol("gpu_packing", None, seed=0)
    assert placed_on(packing(cluster(idle_big, idle_small, used, pending=[job(1, cpus=1)]), 0.0))[1][0] == "used"
    # Among idle nodes, FGD's tier scores 33 - GPUs: the 2-GPU node before the 8-GPU one.
    assert placed_on(packing(cluster(idle_big, idle_small, pending=[job(1, cpus=1)]), 0.0))[1][0] == "small"


def test_a_tie_between_nodes_goes_to_the_first_in_node_order_but_random_draws():
    nodes = [node(f"n{i}", gpus=2, model="T4", cpus=32) for i in range(8)]
    for name in ("best_fit", "gpu_packing"):
        chosen = {placed_on(Protocol(name, None, seed=s)(cluster(*nodes, pending=[job(1, cpus=1)]), 0.0))[1][0]
                  for s in range(12)}
        assert chosen == {"n0"}, name
    drawn = {placed_on(Protocol("random_fit", None, seed=s)(cluster(*nodes, pending=[job(1, cpus=1)]), 0.0))[1][0]
             for s in range(12)}
    assert len(drawn) > 3


def test_fgd_packs_whole_gpu_pods_its_gradient_scores_alike_so_an_8_gpu_pod_finds_an_empty_node():
    # A whole-GPU pod changes no typical (half-GPU) pod's fragments on any of these nodes: every node
    # scores the same. Taken in node order the ties fill n0 then n1 and leave n2 empty for the
    # 8-GPU pod; drawn uniformly (upstream kube-scheduler) they spread and nothing is left for it.
    typical = Workload.typical([pod(i, 500, cpu=2000) for i in range(10)])
    nodes = [node(f"n{i}", gpus=8, model="G2", cpus=96) for i in range(3)]
    pending = [job(i, cpus=2, submitted_at=i) for i in range(1, 13)] + [job(13, gpus=8, cpus=64, submitted_at=13)]
    placed = placed_on(Protocol("fgd", typical, seed=0)(cluster(*nodes, pending=pending), 0.0))
    assert placed[13] == ("n2", tuple(range(8)))
    spread = [placed_on(Protocol("fgd", typical, seed=s, first_on_tie=False)(cluster(*nodes, pending=pending), 0.0))
              for s in range(6)]
    assert sum(13 not in p for p in spread) >= 4


def test_typical_pods_are_the_most_popular_exact_requests_up_to_95_percent_cpu_pods_included():
    pods = [pod(i, 500, cpu=4000) for i in range(60)] + [pod(100 + i, 0, gpus=0, cpu=2000) for i in range(36)]
    pods += [pod(200 + i, 1000, cpu=8000) for i in range(3)] + [pod(300, 1000, cpu=9000)]
    workload = Workload.typical(pods)
    shapes = {(c.gpus, c.milli, c.cpu_milli): round(c.popularity, 4) for c in workload.classes}
    # 60 + 36 = 96 of 100 pods reach 95%: the rest (4 pods) is cut, the kept ones renormalised.
    assert shapes == {(1, 500, 4000): round(60 / 96, 4), (0, 0, 2000): round(36 / 96, 4)}
    # A CPU-only typical pod counts every free milli-GPU of a node as a fragment (FGD's "XL/XR").
    cpu_only = Workload.typical([pod(1, 0, gpus=0, cpu=1000)])
    assert cpu_only.node("T4", (1000, 400), 64000, 0) == pytest.approx(1400)
    # Host memory is no dimension of FGD's: a node without any still serves the typical pods.
    assert Workload.typical([pod(1, 500)]).node("T4", (1000,), 64000, 0) == 0


def test_fgd_places_against_the_typical_pods_of_the_original_list():
    # Half-GPU pods are the workload: FGD puts a 0.5 share beside another 0.5 (leaving nothing a
    # typical pod cannot use), not on the GPU where 0.3 is left.
    typical = Workload.typical([pod(i, 500) for i in range(10)])
    snapshot = cluster(node("a", gpus=2, model="T4", cpus=64),
                       pending=[job(1, milli=500, cpus=1), job(2, milli=200, cpus=1), job(3, milli=500, cpus=1)])
    decisions = Protocol("fgd", typical, seed=0)(snapshot, 0.0)
    assert placed_on(decisions) == {1: ("a", (0,)), 2: ("a", (1,)), 3: ("a", (0,))}


def test_cpu_only_pods_are_placed_by_the_baseline_and_hold_cpu():
    snapshot = cluster(node("gpu-free", gpus=2, model="T4", cpus=16),
                       node("gpu-full", gpus=2, busy=2, model="T4", cpus=16),
                       pending=[job(1, gpus=0, cpus=8)])
    decisions = Protocol("best_fit", None, seed=0)(snapshot, 0.0)
    # BestFit: no free GPU left on the full node is the tighter fit; the pod holds no GPU.
    assert placed_on(decisions) == {1: ("gpu-full", ())}
    outcomes = set()
    for seed in range(6):
        run = fill.run([pod(1, 0, gpus=0, cpu=30000), pod(2, cpu=4000)], t4_nodes(1), POLICIES["best_fit"], seed=seed,
                       until=0.5)
        # The CPU-only pod, when it came first, holds the CPU the GPU pod then lacks.
        outcomes.add((len(run), run[-1].physical))
        assert all(r.cpu_over == 0 for r in run)
    assert outcomes == {(2, 0.0), (1, 0.5)}


def test_colony_keeps_cpu_only_pods_off_the_node_only_a_big_gpu_pod_can_use():
    # 8-GPU pods asking 120 CPUs fit the 128-CPU nodes only. Once one runs, a CPU-only pod that
    # arrives before the next used to go where the most CPU was free and fail it; it now takes
    # the node whose GPUs no such pod can use anyway.
    nodes = (t4_nodes(1, gpus=8, cpu=96000, prefix="small") + t4_nodes(2, gpus=8, cpu=128000, prefix="big"))
    pods = [pod(1, gpus=8, cpu=120000), pod(2, gpus=8, cpu=120000), pod(3, 0, gpus=0, cpu=16000),
            pod(4, 0, gpus=0, cpu=16000)]
    cut = 0.6  # the list ends at the second 8-GPU pod
    between = [seed for seed in range(12)
               if [p.gpus for p in fill.arrivals(pods, 24000, seed, cut)][:2] == [8, 0]]
    assert between
    for seed in between:
        placed = {rule: fill.run(pods, nodes, POLICIES["fair_share"], seed=seed, until=cut, cpu_only=rule)[-1].physical
                  for rule in fill.CPU_ONLY_RULES}
        assert placed == {"least_stranding": pytest.approx(2 / 3), "most_free_cpu": pytest.approx(1 / 3)}, seed


def test_colony_leaves_a_node_the_cpu_its_free_gpus_need():
    # One-GPU pods asking 12 CPUs: the 24-CPU node feeds both its GPUs only if the CPU-only pod
    # goes to the 64-CPU node, though the 24-CPU node is the tighter fit for it.
    nodes = t4_nodes(1, cpu=24000, prefix="tight") + t4_nodes(1, cpu=64000, prefix="roomy")
    pods = [pod(i, cpu=12000) for i in range(1, 5)] + [pod(5, 0, gpus=0, cpu=10000)]
    checked = 0
    for seed in range(12):
        order = [p.gpus for p in fill.arrivals(pods, 4000, seed, 1.0)]
        if 0 not in order or order[0] == 0:
            continue  # it must arrive after a one-GPU pod: before any, no request says what to keep
        checked += 1
        assert fill.run(pods, nodes, POLICIES["fair_share"], seed=seed, until=1.0)[-1].physical == 1.0, seed
    assert checked


class Recorder:
    """A policy that places nothing and notes which pods each cycle was shown."""

    def __init__(self):
        self.seen: list[int] = []

    def __call__(self, snapshot, now, config=None):
        self.seen.extend(j.id for j in snapshot.pending)
        return Decisions()


def test_a_pod_that_fails_is_never_retried():
    recorder = Recorder()
    readings = fill.run([pod(i, 500) for i in range(1, 20)], t4_nodes(2), recorder, seed=0, step=0.1)
    assert sorted(recorder.seen) == sorted(set(recorder.seen)) and len(recorder.seen) == len(readings)
    assert readings[-1].physical == 0 and readings[-1].arrived >= 1.3


def test_batches_are_one_by_one_arrival_for_the_baselines():
    pods = [pod(i, m, cpu=3000) for i, m in enumerate([300, 700, 500, 1000, 250, 800, 600] * 6, start=1)]
    pods += [pod(100 + i, 0, gpus=0, cpu=6000) for i in range(6)]
    nodes = t4_nodes(4) + t4_nodes(2, gpus=4, cpu=48000, prefix="m")
    for name in ("random_fit", "best_fit", "gpu_packing", "fgd"):
        one_by_one = fill.run(pods, nodes, POLICIES[name], seed=3, step=1e-9)
        batched = fill.run(pods, nodes, POLICIES[name], seed=3, step=0.25)
        assert [(r.arrived, r.physical) for r in one_by_one] == [(r.arrived, r.physical) for r in batched], name


def test_gpu_memory_is_no_constraint_in_the_protocol():
    # A whole-GPU pod that peaks at 30 GiB still takes a 16 GiB T4: FGD's runs have no GPU memory.
    pods = [pod(i, 1000, memory_mib=30 * GIB) for i in range(1, 4)]
    for name in ("best_fit", "fgd", "fair_share"):
        readings = fill.run(pods, t4_nodes(1), POLICIES[name], seed=0, until=1.0)
        assert readings[-1].physical == pytest.approx(1.0), name


def test_the_level_reads_the_mean_over_pods_whose_arrived_share_rounds_to_it():
    readings = [fill.Reading(a, p, p) for a, p in [(0.794, 0.70), (0.796, 0.78), (0.80, 0.79), (0.804, 0.80),
                                                   (0.806, 0.81)]]
    assert fill.at(readings, 0.8).physical == pytest.approx((0.78 + 0.79 + 0.80) / 3)


@pytest.mark.skipif(not (loaders.TRACES_DIR / published.PUBLISHED_CSV).is_file(), reason="published results not found")
def test_published_spread_is_read_per_baseline_and_only_for_the_whole_cluster():
    figures = published.published("default", fill.LEVELS, gpus=6212)
    assert figures["fgd"]["100"]["n"] == 10
    assert figures["fgd"]["100"]["min"] <= 0.952 <= figures["fgd"]["100"]["max"]
    assert figures["best_fit"]["130"]["median"] == pytest.approx(0.9305, abs=0.002)
    assert published.published("default", fill.LEVELS, gpus=100) == {}
    assert published.inside(0.952, figures["fgd"]["100"]) and not published.inside(0.93, figures["fgd"]["100"])

