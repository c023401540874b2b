"""What a job gets this cycle, recorded (``JobOutcomes``): a placement (with the note its timeline
shows and what it takes of capacity, its tenant, its user and its array), or a wait with its
reason and ETA. The passes decide; this is the one place that writes a decision down.
"""

from __future__ import annotations

from operator import attrgetter

from jobs.scheduling import reasons
from jobs.scheduling.capacity import load_milli
from jobs.scheduling.cycle_state import CycleInputs, CycleState, Memo
from jobs.scheduling.decisions import Place, Preempt, PreemptReason, new_pending
from jobs.scheduling.placement import Choice, OneNodeWait, Shape
from jobs.scheduling.reasons import PendingReason
from jobs.scheduling.search import GpuSearch
from jobs.scheduling.snapshot import JobClass, JobRequest, Promise
from jobs.scheduling.topology import rendezvous_of, slices_of
from jobs.scheduling.usage import charged_milli
from jobs.scheduling.user_limits import UserLimits

GUARANTEED, OPPORTUNISTIC = JobClass.GUARANTEED, JobClass.OPPORTUNISTIC
_guaranteed_count, _capacity_mib = attrgetter("guaranteed_count"), attrgetter("capacity_mib")


def node_names(gpus) -> tuple[str, ...]:
    return tuple(sorted({gpu.node.name for gpu in gpus}))


class JobOutcomes:
    def __init__(self, inputs: CycleInputs, state: CycleState, memo: Memo, users: UserLimits, search: GpuSearch):
        self.now, self.config, self.capacity = inputs.now, inputs.config, inputs.capacity
        self.state, self.memo, self.users, self.search = state, memo, users, search

    def place(self, job: JobRequest, shape: Shape, job_class: JobClass, choice: Choice) -> None:
        state = self.state
        gpus = [gpu for _, node_gpus in choice.slices for gpu in node_gpus]
        next_to_guarantee = any(map(_guaranteed_count, gpus))
        duty = self.config.shared_start_duty_cycle if job_class is OPPORTUNISTIC and next_to_guarantee else 1.0
        # (its load at the duty cycle it starts at, as the next cycle reads it back: a borrower
        # beside a guaranteed job counted whole here left room that opened only a cycle later, one
        # borrower a cycle, its queue's verdicts flapping meanwhile)
        profile = job.profile
        load = load_milli(profile.mean_utilisation if profile is not None else None, job.gpu_milli, duty)
        self.capacity.take(gpus, job_class, choice.memory_mib, load, shape.gpu_milli, shape.shareable,
                           shape.cpu_per_gpu, shape.host_mb_per_gpu, shape.accepts_unfenced, shape.headroom_mib)
        self.count(job, job_class, gpus)
        biggest = max(choice.memory_mib)
        capacity = min(map(_capacity_mib, gpus))
        protected = job_class is GUARANTEED and not shape.shareable
        limit = None if protected or biggest >= capacity else min(capacity, biggest + shape.headroom_mib)
        slices = slices_of(choice.slices)
        state.placements.append(Place(
            job_id=job.id, slices=slices, job_class=job_class, memory_limit_mib=limit, gpu_milli=job.gpu_milli,
            duty_cycle=duty, allreduce_s=choice.allreduce_s, rendezvous=rendezvous_of(job.id, slices, self.config),
            note=self._note(job, shape, slices, gpus)))
        state.handled.add(job.id)
        state.version += 1
        self.users.placed(job)
        if job.array_id is not None:
            state.array_running[job.array_id] += 1
            if job.expected_runtime_s is not None:
                state.array_ends[job.array_id].append(self.now + job.expected_runtime_s)

    def _note(self, job: JobRequest, shape: Shape, slices, gpus) -> str:
        """One sentence for the job's timeline: where it went and why there."""
        if len(slices) == 1:
            if job.gpus > 1:
                return f"On one node ({slices[0].node})."
            others = gpus[0].occupants - 1  # (already counts this job)
            if others:
                return (f"On {slices[0].node}, GPU {slices[0].gpu_indices[0]}, sharing it with "
                        f"{others} running job{'s' if others != 1 else ''}.")
            return f"On {slices[0].node}, GPU {slices[0].gpu_indices[0]}."
        names = ", ".join(s.node for s in slices)
        spread = f"Spread over {len(slices)} nodes ({names})"
        if not self.search.fits_one_node(shape):
            return f"{spread}: no node has {job.gpus} GPUs of one model that fit it."
        if self.config.gang_single_node_wait_s <= 0:
            return f"{spread}: no node had {job.gpus} free GPUs (waiting for one node is switched off)."
        return (f"{spread} after waiting {reasons.duration(self.now - job.submitted_at)} for one node "
                f"with {job.gpus} free GPUs.")

    def count(self, job: JobRequest, job_class: JobClass, gpus=None) -> None:
        """What the job's tenant holds, with the job (placed on ``gpus``, or promised GPUs it
        starts on alone): a borrower over-committing a GPU counts its share (``usage.charged_milli``)."""
        if gpus is None or job_class is GUARANTEED:
            self.state.held[job.tenant] += job.quota_milli
        else:
            self.state.held[job.tenant] += charged_milli(job.gpu_milli, [gpu.requested_milli for gpu in gpus], True)
        if job_class is GUARANTEED:
            self.state.guaranteed_held[job.tenant] += job.quota_milli

    def wait(self, job: JobRequest, reason: PendingReason, eta_at: float | None = None) -> None:
        self.state.pending.append(new_pending((job.id, reason, eta_at)))

    def take_back(self, job: JobRequest, job_class: JobClass, victims, gpus, why: PreemptReason, told: str,
                  reason: PendingReason) -> None:
        """GPUs freed for ``job`` (a guarantee's reclaim, a borrower's turnover): ``victims`` are
        preempted (``why``, ``told``), the GPUs promised to it (the next in line must not take them,
        or a victim would take them back: thousands of preemptions), and it waits on them."""
        for victim in victims:
            self.state.preemptions.append(Preempt(victim.id, why, told, for_job_id=job.id))
        self.state.promises.append(Promise(job.id, job.tenant, tuple(gpu.id for gpu in gpus)))
        self.count(job, job_class)
        self.wait(job, reason, eta_at=self.now)

    def array_full(self, job: JobRequest, more: int = 0) -> bool:
        """Is ``job``'s array at its limit (with ``more`` of its jobs about to run)?"""
        return self.state.array_running[job.array_id] + more >= job.array_limit

    def wait_for_array(self, job: JobRequest) -> None:
        state = self.state
        array, limit = job.array_id, job.array_limit
        running = state.array_running[array]
        # The i-th waiting job of the array starts once (running - limit + i + 1) of its jobs ended.
        position = running - limit + state.array_blocked[array]
        state.array_blocked[array] += 1
        ends = state.array_ends.get(array)
        eta_at = None
        if ends and position < len(ends):
            ends.sort()
            eta_at = ends[position]
        self.wait(job, self.memo.reason(reasons.array_limit, array, running, limit), eta_at)

    def wait_for_one_node(self, job: JobRequest, wait: OneNodeWait) -> None:
        bound = self.config.gang_single_node_wait_s
        reason = self.memo.reason(reasons.waiting_for_one_node, job.gpus, wait.spread_nodes, bound)
        # At the latest it is spread then (if the spread is still possible).
        self.wait(job, reason, job.submitted_at + bound)
