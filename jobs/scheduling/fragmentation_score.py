"""Score: FGD's fragmentation gradient (Weng et al., ATC'23) for a one-GPU placement on the cycle's
``Capacity``: how much placing the job there raises its node's fragmentation ``F_n(M)``, M being
the classes of the requests the snapshot holds (pending and running), weighted by their count
(a gang's class by how few nodes fit it too: ``Workload.of``), plus how many of its free
milli-GPUs its free CPU can no longer feed (``stranded``).

The placer asks it to rank the candidates its indexes find (GPUs whose residents' requests leave
room, and empty GPUs); lower is better. It reads only requests (milli-GPUs, CPU, host memory), not
live load: fragmentation is about what can still be promised, and a GPU over-committed by
borrowers counts as full. The target workload is built on first use, so a cycle that places
nothing pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from jobs.scheduling.fragmentation import WHOLE, Workload

INF = float("inf")


def free_share(gpu) -> int:
    """A GPU's milli-GPUs not promised to anyone (0 when blocked or over-committed)."""
    return 0 if gpu.blocked else max(0, WHOLE - gpu.requested_milli)


class FragmentationScore:
    name = "fgd"

    def __init__(self, requests: Callable[[], Iterable], hosts: Callable[[], Iterable] | None = None,
                 workload: Callable[[], Workload] | None = None):
        """``hosts``: the nodes as ``Workload.of`` reads them (``snapshot_hosts``), to weigh a gang
        class by how few nodes fit it. ``workload``: builds what ``Workload.of`` would of the
        two (``cycle_workload``), sooner."""
        self._requests = requests
        self._hosts = hosts
        self._build = workload
        self._workload = None
        # node key -> (its ``changes`` then, free milli per GPU, CPU, host memory, model, F_n(M))
        self._nodes: dict[int, tuple] = {}

    @property
    def workload(self):
        if self._workload is None:
            self._workload = (self._build() if self._build is not None else Workload.of(
                list(self._requests()), None if self._hosts is None else list(self._hosts())))
        return self._workload

    def delta(self, node, gpus, shape) -> float:
        """``F_n(M)`` plus the node's stranded GPUs (``stranded``) after the job takes
        ``shape.gpu_milli`` of each of ``gpus`` (all on ``node``; one GPU or a one-node gang) minus
        before."""
        state = self._nodes.get(node.key)
        if state is None or state[0] != node.changes:
            free = tuple([free_share(g) for g in node.gpus])
            cpu = INF if node.cpu_free is None else node.cpu_free
            memory = INF if node.host_free_mb is None else node.host_free_mb
            model = node.gpus[0].model
            state = self._nodes[node.key] = (node.changes, free, cpu, memory, model,
                                             self.workload.node(model, free, cpu, memory)
                                             + self.stranded(sum(free), cpu))
        _, free, cpu, memory, model, before = state
        after = list(free)
        positions = node.gpus.index
        for gpu in gpus:
            i = positions(gpu)
            after[i] = max(0, after[i] - shape.gpu_milli)
        count = len(gpus)
        cpu_after = cpu - shape.cpu_per_gpu * count
        return (self.workload.node(model, tuple(after), cpu_after, memory - shape.host_mb_per_gpu * count)
                + self.stranded(sum(after), cpu_after) - before)

    def stranded(self, free_milli: float, cpu_free: float) -> float:
        """The free milli-GPUs a node's free CPU cannot feed at the workload's CPU per milli-GPU.

        ``F_n(M)`` sees CPU only at each class's CPU, a step: it would rather open a fresh node
        than take a used one's CPU below a class's step, and the fresh nodes it opens end with
        whole GPUs and no CPU (issue 34). This term grows with every CPU milli a placement takes
        beyond its GPUs' share, so of two placements the one that leaves CPU for the node's free
        GPUs wins."""
        per_milli = self.workload.cpu_per_milli
        if not per_milli:
            return 0.0
        return max(0.0, free_milli - cpu_free / per_milli)


def leftover(node, gpus, shape) -> float:
    """BestFit's measure of what a placement leaves on its node (free GPU share plus free CPU share
    after it), the tie-break between placements the gradient ranks alike: of two nodes the job
    fragments equally, the tighter one keeps the larger free for what needs it."""
    gpu_left = (sum(free_share(g) for g in node.gpus) - shape.gpu_milli * len(gpus)) / (WHOLE * len(node.gpus))
    if not node.cpu_total:
        return gpu_left
    return gpu_left + (node.cpu_free - shape.cpu_per_gpu * len(gpus)) / node.cpu_total


class RunningAsRequest:
    """A running job as one more request of the target workload (its class is what it asked for)."""

    __slots__ = ("gpus", "gpu_milli", "gpu_models", "cpu_milli", "host_memory_mb")

    def __init__(self, job):
        self.gpus, self.gpu_milli, self.gpu_models = len(job.gpu_ids), job.gpu_milli, frozenset()
        self.cpu_milli, self.host_memory_mb = job.cpu_milli, job.host_memory_mb


def snapshot_requests(snapshot) -> Callable[[], Iterable]:
    def requests():
        yield from snapshot.pending
        for job in snapshot.running:
            yield RunningAsRequest(job)
    return requests


def cycle_workload(snapshot, carry) -> Callable[[], Workload]:
    """What ``Workload.of(snapshot_requests(snapshot)(), snapshot_hosts(snapshot)())`` builds, with
    the queue counted by tenant and kept in ``carry`` (``QueueTallies``) while a tenant's jobs stay."""
    def workload():
        return carry.tallies.workload(carry.tenants_of(snapshot.pending), map(RunningAsRequest, snapshot.running),
                                      list(snapshot_hosts(snapshot)()))
    return workload


def snapshot_hosts(snapshot) -> Callable[[], Iterable]:
    def hosts():
        for node in snapshot.nodes:
            if node.gpus:
                yield node.gpus[0].model, len(node.gpus), node.cpu_milli, node.host_memory_mb
    return hosts
