"""What a node is told to start for one attempt of a job: its GPU slices, environment and limits.

Shared by the first launch of an attempt (:func:`jobs.services.lifecycle.place_many`) and its re-sends
(:func:`jobs.services.apply.resend_unstarted_launches`), so a re-sent launch is byte-for-byte the
same command as the one it replaces: same command id, same gang rendezvous, same limits.
"""

from __future__ import annotations

from collections import defaultdict

from agents import protocol
from jobs.models import Allocation, Job
from jobs.scheduling.decisions import NodeSlice, Rendezvous
from jobs.scheduling.filters.host_resources import per_gpu
from jobs.scheduling.topology import rendezvous_of
from jobs.services.commands import send_launch
from jobs.services.scheduler_config import scheduler_config
from monitoring.models import Node


# Job fields a launch is built from (for ``.only()``); ``launch_spec`` turns them into its fields.
LAUNCH_FIELDS = ("command", "env", "attempt", "max_runtime_s", "tenant__slug", "workdir", "code_id", "image", "venv",
                 "conda", "stop_signal", "array_id", "array_index", "gpu_milli", "run_class", "owner__username",
                 "owner__oidc_identity__posix_name", "gpus", "cpu_milli", "host_memory_mib")
# The relations those fields reach through (for ``.select_related()``): one query for many launches.
LAUNCH_RELATED = ("tenant", "owner", "owner__oidc_identity")


def launch_spec(job: Job, node_slice: NodeSlice | None = None) -> dict:
    """The launch's fields that come from the job spec as submitted (where and in what it runs, and
    the compute share an MPS GPU caps a fractional job at), how it was admitted (its node
    protects a guaranteed job from its borrowers by itself), whose it is (:func:`submitter`) and
    the host memory and CPU its node holds it to (:func:`host_limits`; ``node_slice``: its GPUs
    on that node, None for a job on one node)."""
    return {"workdir": job.workdir or None, "image": job.image or None, "venv": job.venv or None,
            "conda": job.conda or None, "stop_signal": job.stop_signal, "array_id": job.array_id,
            "array_index": job.array_index, "code_id": job.code_id, "compute_share": compute_share(job.gpu_milli),
            "job_class": job.run_class or None, **submitter(job),
            **host_limits(job, len(node_slice.gpu_indices) if node_slice is not None else None)}


def host_limits(job: Job, gpus_here: int | None) -> dict:
    """The job's CPU and host memory request as its node's cgroup limits (``cpu.max``,
    ``memory.max``): a gang's share on a node is in proportion to its GPUs there, as the scheduler
    counts it (``jobs.scheduling.filters.host_resources``), so no node holds it to less than it
    was placed with. None where the job asked for none (0). ``gpus_here``: the job's GPUs on the
    node (None: all of them, a job on one node)."""
    def share(total: int, bound: int) -> int | None:
        if not total:
            return None
        if job.gpus and gpus_here is not None:
            total = per_gpu(total, job.gpus) * gpus_here
        return min(total, bound) or None

    return {"cpu_milli": share(job.cpu_milli, protocol.CPU_MILLI_MAX),
            "host_memory_mib": share(job.host_memory_mib, protocol.HOST_MEMORY_MIB_MAX)}


def submitter(job: Job) -> dict:
    """Whose job it is, for the node to run it as their own account: the owner's user name, and
    their POSIX name where single sign-on carried one (``COLONY_OIDC_POSIX_CLAIM``)."""
    identity = getattr(job.owner, "oidc_identity", None)  # (none: a local account)
    return {"user": job.owner.username, "posix_user": (identity.posix_name or None) if identity else None}


def compute_share(gpu_milli: int) -> float | None:
    """A fractional job's share of its GPU's compute (its milli-GPUs / 1000); None: the whole GPU."""
    return gpu_milli / 1000 if gpu_milli < 1000 else None


def launch_envs(job_env: dict, slices: tuple[NodeSlice, ...], rendezvous: Rendezvous | None,
                hosts: dict[str, str] | None = None) -> dict[str, dict]:
    """Per node: the job's own variables plus, for a gang, the torchrun rendezvous of that node.
    ``hosts``: node name -> hostname, when the caller read them for many jobs at once."""
    if rendezvous is None:
        return {s.node: dict(job_env) for s in slices}
    if hosts is None:
        hosts = master_hosts([rendezvous])
    envs = {}
    for node_slice in slices:
        env = {**job_env, **rendezvous.env(node_slice, local_rank=0)}
        env["MASTER_ADDR"] = hosts.get(rendezvous.master_node) or rendezvous.master_node
        envs[node_slice.node] = env
    return envs


def master_hosts(rendezvous) -> dict[str, str]:
    """Node name -> hostname of the master nodes of these rendezvous (one query)."""
    return dict(Node.objects.filter(name__in={r.master_node for r in rendezvous if r is not None})
                .values_list("name", "hostname"))


def live_slices(job_id: int) -> tuple[tuple[NodeSlice, ...], dict[str, tuple[int | None, float]]]:
    """The job's live placement as the core made it (node ranks, global ranks), and per node its
    memory limit and duty cycle."""
    by_node: dict[str, list[Allocation]] = defaultdict(list)
    for allocation in Allocation.objects.filter(job_id=job_id, released_at__isnull=True).select_related("gpu__node"):
        by_node[allocation.gpu.node.name].append(allocation)
    slices, first_rank = [], 0
    for node, held in sorted(by_node.items(), key=lambda item: (item[1][0].rank, item[0])):
        held.sort(key=lambda a: a.gpu.index)
        slices.append(NodeSlice(node=node, gpu_ids=tuple(a.gpu_id for a in held),
                                gpu_indices=tuple(a.gpu.index for a in held), node_rank=held[0].rank,
                                first_rank=first_rank))
        first_rank += len(held)
    return tuple(slices), {node: (held[0].memory_limit_mib, held[0].duty_cycle) for node, held in by_node.items()}


def send_attempt(job: Job) -> int:
    """Send the launch of the job's current attempt to every node it holds GPUs on; returns how
    many nodes were told. ``job`` needs :data:`LAUNCH_RELATED` loaded."""
    slices, limits = live_slices(job.pk)
    envs = launch_envs(job.env, slices, rendezvous_of(job.pk, slices, scheduler_config()))
    for node_slice in slices:
        memory_limit, duty = limits[node_slice.node]
        send_launch(node_slice.node, job.pk, job.command, node_slice.gpu_indices, attempt=job.attempt,
                    env=envs[node_slice.node], gpu_memory_limit_mib=memory_limit, duty_cycle=duty,
                    tenant=job.tenant.slug, max_runtime_s=job.max_runtime_s, **launch_spec(job, node_slice))
    return len(slices)
