"""Why a job is pending: a code a program can match on and a sentence a researcher can read.

One constructor per code keeps the wording in one place; ``details`` carries the numbers behind
the sentence so the API and the queue page can show them without parsing text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import StrEnum

from agents import units

MIB_PER_GIB = 1024


class ReasonCode(StrEnum):
    # The request cannot run on this cluster as it is (inventory, not load).
    NO_NODES_ONLINE = "no_nodes_online"
    INVALID_REQUEST = "invalid_request"
    GPU_MODEL_UNAVAILABLE = "gpu_model_unavailable"
    # It asks for a MIG profile that no schedulable node has an instance of.
    NO_MIG_PROFILE = "no_mig_profile"
    NO_GPU_WITH_ENOUGH_MEMORY = "no_gpu_with_enough_memory"
    GANG_LARGER_THAN_ANY_NODE = "gang_larger_than_any_node"
    GANG_LARGER_THAN_CLUSTER = "gang_larger_than_cluster"
    NEEDS_CORDONED_NODES = "needs_cordoned_nodes"
    # No node has the CPU cores or host memory the request asks for, even with nothing running.
    NO_NODE_WITH_ENOUGH_CPU = "no_node_with_enough_cpu"
    NO_NODE_WITH_ENOUGH_HOST_MEMORY = "no_node_with_enough_host_memory"
    # It runs in a container image and no schedulable node with a container runtime can take it.
    NEEDS_CONTAINER_RUNTIME = "needs_container_runtime"
    # The researcher's own ordering: jobs it depends on have not ended, or its array is at its cap.
    WAITING_FOR_DEPENDENCY = "waiting_for_dependency"
    ARRAY_LIMIT = "array_limit"
    # Its owner runs as many jobs, or holds as many GPUs, as a tenant lead allows them.
    USER_LIMIT = "user_limit"
    # Quota.
    AT_MAX_GPUS = "at_max_gpus"
    # The job alone asks for more than its tenant's ceiling: no amount of waiting helps.
    OVER_MAX_GPUS = "over_max_gpus"
    OVER_QUOTA_CLUSTER_FULL = "over_quota_cluster_full"
    NO_SPARE_CAPACITY = "no_spare_capacity"
    BEHIND_LOWER_USAGE_TENANTS = "behind_lower_usage_tenants"
    # Load.
    WAITING_FOR_FREE_GPUS = "waiting_for_free_gpus"
    # GPUs that fit are free, but the nodes that have them lack the CPU or host memory it asked for.
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_HOST_MEMORY = "insufficient_host_memory"
    # A gang that could be spread now waits (bounded) for one node to have room for all of it.
    WAITING_FOR_ONE_NODE = "waiting_for_one_node"
    RECLAIMING = "reclaiming"
    RESERVED_FOR_GANG = "reserved_for_gang"
    HOLDING_RESERVATION = "holding_reservation"
    NOT_CONSIDERED = "not_considered"
    # Back in the queue after a run that did not finish (written by the service layer when it
    # requeues; the next cycle replaces it with one of the codes above).
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    VANISHED_FROM_NODE = "vanished_from_node"
    AGENT_RESTARTED = "agent_restarted"
    REQUEUED_BY_OPERATOR = "requeued_by_operator"
    IDLE_REQUEUED = "idle_requeued"  # its tenant's idle-GPU policy sent it back
    # A fault in one job took down every job sharing its GPU's MPS server, this one included.
    GPU_SHARING_FAULT = "gpu_sharing_fault"


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: ReasonCode
    message: str
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The stored and wire form (the scheduling loop adds ``eta_at`` beside these three)."""
        return {"code": str(self.code), "message": self.message, "details": dict(self.details)}


def gib(mib: float) -> str:
    """'20 GiB', '20.5 GiB', '512 MiB': as the pages word a size."""
    return units.format_mib(mib)


def _gpus(n: float) -> str:
    text = f"{n:g}"
    return f"{text} GPU" if n == 1 else f"{text} GPUs"


def no_nodes_online(nodes: int, cordoned: int) -> PendingReason:
    if nodes and cordoned == nodes:
        message = f"No GPU node is online and accepting jobs: all {nodes} are cordoned."
    else:
        message = "No GPU node is online and accepting jobs."
    return PendingReason(ReasonCode.NO_NODES_ONLINE, message, {"nodes": nodes, "cordoned": cordoned})


def needs_cordoned_nodes(cordoned: list[str], otherwise: PendingReason) -> PendingReason:
    """The request would fit if the cordoned nodes took work; ``otherwise`` is why it fits nowhere else."""
    shown = ", ".join(cordoned[:5]) + (f" and {len(cordoned) - 5} more" if len(cordoned) > 5 else "")
    return PendingReason(
        ReasonCode.NEEDS_CORDONED_NODES,
        f"Only cordoned nodes ({shown}) can run this job; it waits until an operator uncordons one. "
        f"Elsewhere: {otherwise.message}",
        {"cordoned": cordoned, "otherwise": otherwise.as_dict()},
    )


def needs_container_runtime(runtime_nodes: list[str], needed_gpus: int) -> PendingReason:
    """``runtime_nodes``: the schedulable nodes that advertise a container runtime (maybe none)."""
    if not runtime_nodes:
        message = ("No node runs containers; this job has an image, so it waits until a node with a container "
                   "runtime (docker, podman or apptainer) comes online. Submit it without an image to run it "
                   "directly.")
    else:
        shown = ", ".join(runtime_nodes[:5]) + (f" and {len(runtime_nodes) - 5} more" if len(runtime_nodes) > 5 else "")
        message = (f"This job has an image, so it runs only on nodes with a container runtime ({shown}), and "
                   f"they do not have {_gpus(needed_gpus)} that fit it. Submit it without an image to run it "
                   f"on the other nodes.")
    return PendingReason(ReasonCode.NEEDS_CONTAINER_RUNTIME, message,
                         {"runtime_nodes": runtime_nodes, "needed_gpus": needed_gpus})


def waiting_for_dependency(waiting_for: tuple[tuple[int, str], ...]) -> PendingReason:
    first, kind = waiting_for[0]
    message = f"Waiting for job {first} to {'succeed' if kind == 'ok' else 'end'}"
    if len(waiting_for) > 1:
        others = len(waiting_for) - 1
        message += f" and for {others} other job{'s' if others != 1 else ''} it depends on"
    return PendingReason(
        ReasonCode.WAITING_FOR_DEPENDENCY, message + ".",
        {"waiting_for": [{"job": job_id, "kind": kind} for job_id, kind in waiting_for]},
    )


def array_limit(array_id: int, running: int, limit: int) -> PendingReason:
    return PendingReason(
        ReasonCode.ARRAY_LIMIT,
        f"{running} of array {array_id}'s jobs are running (at most {limit} at once); the next one starts "
        f"when one of them ends.",
        {"array_id": array_id, "running": running, "max_running": limit},
    )


def user_limit(name: str, tenant: str, running: int, max_running: int | None, held_gpus: float,
               max_gpus: int | None, need_gpus: float, which: str) -> PendingReason:
    """``which``: "jobs" (at ``max_running``) or "gpus" (this job would pass ``max_gpus``)."""
    if which == "jobs":
        message = (f"{name} has {running} job{'s' if running != 1 else ''} running in {tenant}, the most a tenant "
                   f"lead allows them at once; this one starts when one of them ends.")
    else:
        message = (f"{name} holds {_gpus(held_gpus)} in {tenant} and this job needs {need_gpus:g} more; a tenant "
                   f"lead allows them {_gpus(max_gpus)} at once. It starts when enough of theirs end.")
    return PendingReason(ReasonCode.USER_LIMIT, message, {
        "user": name, "tenant": tenant, "limit": which, "running": running, "max_running": max_running,
        "held_gpus": held_gpus, "max_gpus": max_gpus, "needed_gpus": need_gpus})


def duration(seconds: float) -> str:
    """'45 s', '5 min', '2 h 05 min': worded as every page, the CLI and the pages' script word it
    (a standard-library leaf, the one module of ours the core reads)."""
    return units.format_duration(seconds)


def waiting_for_one_node(gpus: int, spread_nodes: int, wait_s: float) -> PendingReason:
    return PendingReason(
        ReasonCode.WAITING_FOR_ONE_NODE,
        f"Waiting up to {duration(wait_s)} after submission for one node with {gpus} free GPUs rather than "
        f"spreading it over {spread_nodes} nodes (all-reduce inside one node is much faster); after that it "
        f"is spread.",
        {"needed_gpus": gpus, "spread_nodes": spread_nodes, "wait_s": wait_s},
    )


def launch_failed_on_node(node: str, error: str) -> PendingReason:
    """Requeued after its launch failed on ``node`` for that node's reason (a wait reason the core
    never gives: the next cycle replaces it)."""
    return PendingReason("launch_failed_on_node",
                         f"Could not start on node {node}: {error[:400]}. Trying another node.", {"node": node})


def invalid_request(problem: str) -> PendingReason:
    return PendingReason(ReasonCode.INVALID_REQUEST, f"This request cannot be scheduled: {problem}.",
                         {"problem": problem})


def model_unavailable(wanted: frozenset[str], online: list[str]) -> PendingReason:
    wanted_text = " or ".join(sorted(wanted))
    online_text = ", ".join(online) if online else "none"
    return PendingReason(
        ReasonCode.GPU_MODEL_UNAVAILABLE,
        f"Needs a {wanted_text} GPU; no such GPU is online (online models: {online_text}).",
        {"wanted_models": sorted(wanted), "online_models": online},
    )


def no_mig_profile(wanted: str, online: list[str]) -> PendingReason:
    online_text = ", ".join(online) if online else "none"
    return PendingReason(
        ReasonCode.NO_MIG_PROFILE,
        f"Needs a MIG instance of profile {wanted}; no online node has one (online MIG profiles: {online_text}).",
        {"wanted_profile": wanted, "online_profiles": online},
    )


def only_mig_instances(profiles: list[str]) -> PendingReason:
    return PendingReason(
        ReasonCode.GPU_MODEL_UNAVAILABLE,
        f"Needs a whole GPU; only MIG instances are online (profiles: {', '.join(profiles)}). "
        "Ask for one of those profiles to run on them.",
        {"wanted_models": [], "online_models": [], "online_profiles": profiles},
    )


def no_gpu_with_memory(needed_mib: int, largest_mib: int, models: frozenset[str]) -> PendingReason:
    which = f" {' or '.join(sorted(models))}" if models else ""
    return PendingReason(
        ReasonCode.NO_GPU_WITH_ENOUGH_MEMORY,
        f"Needs a GPU with {gib(needed_mib)} of memory; the largest online{which} GPU has {gib(largest_mib)}.",
        {"needed_mib": needed_mib, "largest_mib": largest_mib},
    )


def gang_larger_than_any_node(gpus: int, widest: int, max_nodes: int, one_model: bool = True) -> PendingReason:
    """``one_model``: the policy runs a gang on one GPU model (Colony's core does; a baseline
    that mixes models says so by passing False)."""
    where = "on one node" if max_nodes == 1 else f"on at most {max_nodes} nodes"
    which = " of one model" if one_model else ""
    why = " (a gang runs on one GPU model)" if one_model else ""
    return PendingReason(
        ReasonCode.GANG_LARGER_THAN_ANY_NODE,
        f"Needs {gpus} GPUs {where}; the largest online node has {widest}{which} that fit{why}.",
        {"needed_gpus": gpus, "largest_node_gpus": widest, "max_nodes": max_nodes},
    )


def gang_larger_than_cluster(gpus: int, total: int, one_model: bool = True) -> PendingReason:
    """``one_model``: as for ``gang_larger_than_any_node``."""
    if one_model:
        message = (f"Needs {gpus} GPUs at once; the online cluster has only {total} of one model that fit the "
                   f"request (a gang runs on one GPU model).")
    else:
        message = f"Needs {gpus} GPUs; the online nodes have {total} that fit."
    return PendingReason(ReasonCode.GANG_LARGER_THAN_CLUSTER, message, {"needed_gpus": gpus, "cluster_gpus": total})


def cores(cpu_milli: float) -> str:
    text = f"{cpu_milli / 1000:g}"
    return f"{text} CPU core" if text == "1" else f"{text} CPU cores"


def no_node_with_enough_host(resource: str, needed: int, largest: int | None) -> PendingReason:
    """``resource``: "cpu" (milli-cores) or "memory" (MiB); amounts for the whole job on one node."""
    if resource == "cpu":
        what, largest_text = cores(needed), cores(largest or 0)
        code = ReasonCode.NO_NODE_WITH_ENOUGH_CPU
    else:
        what, largest_text = f"{gib(needed)} of host memory", gib(largest or 0)
        code = ReasonCode.NO_NODE_WITH_ENOUGH_HOST_MEMORY
    return PendingReason(
        code,
        f"Asks for {what} beside its GPUs; no online node that has those GPUs offers that much (the largest "
        f"offers {largest_text}). Ask for less, or spread it over more nodes.",
        {"resource": resource, "needed": needed, "largest_node": largest},
    )


def insufficient_host(resource: str, gpus: int, needed: int) -> PendingReason:
    """GPUs that fit are free but their nodes' CPU or host memory is taken: ``needed`` is the job's
    whole request (milli-cores or MiB)."""
    if resource == "cpu":
        what, code = cores(needed), ReasonCode.INSUFFICIENT_CPU
    else:
        what, code = f"{gib(needed)} of host memory", ReasonCode.INSUFFICIENT_HOST_MEMORY
    return PendingReason(
        code,
        f"{_gpus(gpus)} that fit it are free, but the nodes that have them do not have the {what} it asked "
        f"for free; it starts when jobs there end.",
        {"resource": resource, "needed_gpus": gpus, "needed": needed},
    )


def at_max_gpus(tenant: str, max_milli: int, need_milli: int) -> PendingReason:
    # No figure of what the tenant runs now: it moves with each of its jobs that starts or ends,
    # and each step rewrote the verdict of every job of the tenant waiting at its ceiling
    # (thousands a cycle at 200,000 pending). What it runs is on the usage page.
    ceiling, need = max_milli / 1000, need_milli / 1000
    return PendingReason(
        ReasonCode.AT_MAX_GPUS,
        f"Tenant {tenant} is at its {ceiling:g}-GPU ceiling: what it runs now and this job's {need:g} would "
        f"be more than that. It starts when the tenant's other jobs finish (a borrower on a GPU shared past its "
        f"capacity counts its share of it).",
        {"tenant": tenant, "max_gpus": ceiling, "needed_gpus": need},
    )


def over_max_gpus(tenant: str, max_milli: int, need_milli: int) -> PendingReason:
    ceiling, need = max_milli / 1000, need_milli / 1000
    return PendingReason(
        ReasonCode.OVER_MAX_GPUS,
        f"This job needs {_gpus(need)}, more than tenant {tenant}'s {ceiling:g}-GPU ceiling (max_gpus), so it "
        f"cannot start even with nothing else of the tenant running. An operator can raise the ceiling in "
        f"the admin; otherwise cancel it and submit a smaller job.",
        {"tenant": tenant, "max_gpus": ceiling, "needed_gpus": need},
    )


def over_quota_cluster_full(tenant: str, guaranteed_milli: int, unused_milli: int, needed_gpus: int) -> PendingReason:
    guaranteed, unused = guaranteed_milli / 1000, unused_milli / 1000
    if unused <= 0:
        quota = f"Tenant {tenant} is using all of its {guaranteed:g}-GPU guarantee"
    else:
        quota = f"Tenant {tenant} has {_gpus(unused)} of its {guaranteed:g}-GPU guarantee unused, too few for this job"
    return PendingReason(
        ReasonCode.OVER_QUOTA_CLUSTER_FULL,
        f"{quota}, so it must borrow spare GPUs, and {_spare(needed_gpus)} right now.",
        {"tenant": tenant, "guaranteed_gpus": guaranteed, "unused_guaranteed_gpus": unused, "needed_gpus": needed_gpus},
    )


def no_spare_capacity(needed_gpus: int) -> PendingReason:
    return PendingReason(
        ReasonCode.NO_SPARE_CAPACITY,
        f"Asked to run only on spare capacity, and {_spare(needed_gpus)} right now.",
        {"needed_gpus": needed_gpus},
    )


def behind_lower_usage(tenant: str) -> PendingReason:
    # Nothing here may change from one cycle to the next while the situation does not: every word
    # of a verdict that changes is rewritten for each of tens of thousands of waiting jobs. So no
    # count of the tenants that borrowed this very cycle (a few seconds' worth), and no usage
    # figure: it drifts with every job that starts or ends, and even to two significant figures it
    # rewrote each of a tenant's waiting jobs whenever it crossed a step (15,000 of the 17,000
    # verdicts a cycle rewrote after 8 jobs ended at 200,000 pending). Which tenant is lower is
    # what matters; a tenant's use is on the usage page.
    return PendingReason(
        ReasonCode.BEHIND_LOWER_USAGE_TENANTS,
        f"Tenants with lower or about the same recent usage as {tenant} (per unit of weight) are borrowing the "
        "spare GPUs; borrowing is shared out lowest usage first, and tenants level in usage take turns.",
        {"tenant": tenant},
    )


def waiting_for_free_gpus(gpus: int, needed_mib: int | None, one_node: bool, most_free: int) -> PendingReason:
    memory = f" with {gib(needed_mib)}" if needed_mib else ""
    where = " on one node" if one_node else ""
    return PendingReason(
        ReasonCode.WAITING_FOR_FREE_GPUS,
        f"Waiting for {_gpus(gpus)}{memory}{where}; the most free on any node is {most_free}.",
        {"needed_gpus": gpus, "most_free_on_a_node": most_free},
    )


def preempting_more_served(gpus: int, victims: int) -> PendingReason:
    """A job of the least-attained-service baseline that preempted jobs of lower queues."""
    return PendingReason(
        ReasonCode.RECLAIMING,
        f"Preempting {victims} job{'s' if victims != 1 else ''} that had more GPU time; starts once they have stopped.",
        {"needed_gpus": gpus, "victims": victims})


def no_room_with_host() -> PendingReason:
    """A packing baseline found no node with the GPU share, CPU and host memory together."""
    return PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS,
                         "No node has room for the job's GPU share together with its CPU and memory.")


def cpu_only_not_placed() -> PendingReason:
    """A packing baseline asked to place work without GPUs (the fill replay places it itself)."""
    return PendingReason(ReasonCode.WAITING_FOR_FREE_GPUS, "CPU-only work is not placed here.")


def turning_over(gpus: int, victims: int, nodes: tuple[str, ...] = ()) -> PendingReason:
    """A borrower that preempted borrowers with more GPU time (``turnover``)."""
    where = f" on {', '.join(nodes)}" if nodes else ""
    if victims:
        source = (f"preempting {victims} borrowed job{'s' if victims != 1 else ''} that had more GPU time{where}; "
                  "starts once they have stopped")
    else:
        source = f"{_gpus(gpus)}{where} are promised to it; starts once the borrowed jobs there have stopped"
    return PendingReason(
        ReasonCode.RECLAIMING, f"Borrowed GPUs go to the least served first: {source}.",
        # ("borrowed": reclaiming as a borrower, not within a guarantee)
        {"needed_gpus": gpus, "victims": victims, "borrowed": True, **({"nodes": list(nodes)} if nodes else {})})


def reclaiming(gpus: int, victims: int, nodes: tuple[str, ...] = ()) -> PendingReason:
    """``nodes``: where the GPUs promised to it are (it starts there, or sooner elsewhere)."""
    where = f" on {', '.join(nodes)}" if nodes else ""
    if victims:
        source = f"reclaiming {_gpus(gpus)}{where} from {victims} borrowed job{'s' if victims != 1 else ''}"
    else:
        source = f"{_gpus(gpus)}{where} are being released by borrowed jobs already stopping"
    details = {"needed_gpus": gpus, "victims": victims}
    if nodes:
        details["nodes"] = list(nodes)
    return PendingReason(ReasonCode.RECLAIMING, f"Within your guarantee: {source}; starts once they have stopped.",
                         details)


def reserved_for_gang(holder_job: int, holder_gpus: int, nodes: tuple[str, ...]) -> PendingReason:
    return PendingReason(
        ReasonCode.RESERVED_FOR_GANG,
        f"The free GPUs that fit are held for job {holder_job}, which needs {holder_gpus} GPUs at once "
        f"(nodes {', '.join(nodes)}); jobs that declare a runtime ending before it can start may use them.",
        {"holder_job": holder_job, "holder_gpus": holder_gpus, "nodes": list(nodes)},
    )


def holding_reservation(gpus: int, nodes: tuple[str, ...], until: float, now: float) -> PendingReason:
    return PendingReason(
        ReasonCode.HOLDING_RESERVATION,
        f"Needs {gpus} GPUs at once; node{'s' if len(nodes) != 1 else ''} {', '.join(nodes)} "
        f"{'are' if len(nodes) != 1 else 'is'} held for it for up to {max(0, until - now) / 60:.0f} more min "
        f"while running jobs there finish.",
        {"needed_gpus": gpus, "nodes": list(nodes),
         "held_until": datetime.fromtimestamp(until, tz=timezone.utc).isoformat(timespec="seconds")},
    )


def _spare(needed_gpus: int) -> str:
    """'the 1 spare GPU it needs is not free' / 'the 4 spare GPUs it needs are not free'."""
    verb = "is" if needed_gpus == 1 else "are"
    return f"the {_gpus(needed_gpus).replace(' GPU', ' spare GPU')} it needs {verb} not free"


def not_considered(limit: int) -> PendingReason:
    return PendingReason(
        ReasonCode.NOT_CONSIDERED,
        f"Queued; this cycle stopped after {limit} placement searches and will reach this job later.",
        {"search_limit": limit},
    )


# -- back in the queue --------------------------------------------------------------------------

def preempted(why: str) -> PendingReason:
    return PendingReason(ReasonCode.PREEMPTED, why, {})


def node_lost(node: str) -> PendingReason:
    return PendingReason(ReasonCode.NODE_LOST,
                         f"Requeued: node {node} stopped responding while this job ran on it.", {"node": node})


def vanished_from_node(node: str, asked: bool) -> PendingReason:
    """``asked``: the node answered that it does not run the attempt (else it stopped listing it)."""
    if asked:
        message = f"Requeued: node {node} does not run this job's current attempt (its agent restarted without it?)."
    else:
        message = f"Requeued: node {node} stopped reporting this job (its agent restarted?)."
    return PendingReason(ReasonCode.VANISHED_FROM_NODE, message, {"node": node})


def agent_restarted(node: str) -> PendingReason:
    return PendingReason(ReasonCode.AGENT_RESTARTED,
                         f"Requeued: the agent on node {node} restarted or stopped while this job ran.", {"node": node})


def idle_requeued(figures: str, idle_minutes: int) -> PendingReason:
    return PendingReason(ReasonCode.IDLE_REQUEUED, f"Requeued by its tenant's idle-GPU policy: {figures}",
                         {"idle_minutes": idle_minutes})


def gpu_sharing_fault(node: str, what: str) -> PendingReason:
    """``what``: the node's words (which GPU, which MPS process died)."""
    return PendingReason(
        ReasonCode.GPU_SHARING_FAULT,
        f"Requeued: on node {node}, {what}. A fault in one job sharing a GPU through MPS stops every job on it.",
        {"node": node, "what": what},
    )


def requeued_by_operator(by: str) -> PendingReason:
    return PendingReason(ReasonCode.REQUEUED_BY_OPERATOR, f"Requeued by operator {by}; waiting to be placed again.",
                         {"by": by})
