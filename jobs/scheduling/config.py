"""The scheduler's knobs, with the defaults the production loop and the simulator start from.

Only plain numbers live here; the service reads operator overrides from settings and passes a
``SchedulerConfig`` in. Nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Fair share. A tenant's recent use decays with this half-life ("idle all week is not punished
    # for one burst"); GPUs held now count as the decayed usage they would converge to if held on.
    usage_half_life_s: float = 24 * 3600.0

    # Packing. Spare memory kept on a shared GPU so a neighbour's growth does not OOM the others.
    share_memory_headroom_mib: int = 1 * GIB
    # Opportunistic work joins a GPU whose estimated load (residents' live utilisation, else their
    # profile or request) is below this many milli-GPUs...
    max_shared_load_milli: int = 1000
    # ...and whose spare compute covers the newcomer's demand (profile, else request) or at least
    # this much: borrowers run on what is spare, and throttling protects guaranteed neighbours.
    min_shared_room_milli: int = 250

    # Throttling (AIMD on the duty cycle of opportunistic jobs; the agent time-slices them).
    duty_cycle_floor: float = 0.1
    # An opportunistic job already at the floor that a GPU still says to slow down is suspended
    # (duty cycle 0: SIGSTOP; it keeps its GPU memory, frees all compute) until there is room.
    suspend_at_floor: bool = True
    duty_cycle_ceiling: float = 1.0
    duty_cycle_increase: float = 0.1
    duty_cycle_decrease_factor: float = 0.5
    # Duty cycle of an opportunistic job started on a GPU that a guaranteed job already uses: low,
    # so the guaranteed job starts near its solo speed and AIMD probes upward from there.
    shared_start_duty_cycle: float = 0.25
    # A guaranteed job is "slowed" when its live utilisation is below its solo profile by more than
    # this fraction of it: the promise is about 5% at most (AntMan: as fast as alone). It was 0.05
    # utilisation points until the replay of windows it had not been tuned on: there a job at 6-14%
    # solo utilisation beside borrowers ran 45-75% slower than alone (Philly from 2017-12-08, 7 of
    # 118 guaranteed jobs over 20%); as a fraction none of the ten windows' runs has one over 5%.
    slowdown_margin: float = 0.05
    # ... and a borrower speeds up only while every guaranteed neighbour is within this fraction of
    # its solo profile. Between the two it holds: without that band, a neighbour slowed by
    # interference sent its borrower down and up every few cycles (a sawtooth of throttle commands).
    raise_margin: float = 0.025
    # GPU utilisation at or above which a GPU with a guaranteed job counts as saturated.
    saturated_utilisation: float = 0.95
    # GPU utilisation below which opportunistic neighbours may speed up again.
    room_utilisation: float = 0.85

    # Topology (ring all-reduce cost model): bandwidth between nodes in one rack and across racks.
    inter_node_gb_per_s: float = 25.0
    inter_rack_gb_per_s: float = 12.5
    default_allreduce_bytes: int = 1_000_000_000
    # Rendezvous port for multi-GPU jobs: base + job id modulo span (deterministic, no I/O).
    rendezvous_port_base: int = 29500
    rendezvous_port_span: int = 1000

    # Starvation guard for gangs: the first blocked gang holds its best node(s) for this long (0: off).
    gang_reservation_max_s: float = 600.0
    # A gang that fits on one node (of one model) but finds no node with room waits this long from
    # its submission for one rather than being spread over several: across nodes every all-reduce
    # crosses the network, which can cost more than the wait. 0 spreads at once.
    gang_single_node_wait_s: float = 300.0

    # Work caps per cycle (the loop runs every few seconds; what is left waits for the next one).
    max_placement_searches: int = 20_000
    max_reclaims: int = 64
    # Pause Python's cyclic garbage collector during a cycle (see ``cycle.decide``).
    pause_gc: bool = True

    # (Last: a config pickled before it, in a bench snapshot, keeps its other fields in place.)
    # Reclaim: a node whose victims lose at most this many GPU-seconds of progress more than the
    # least is as good, if taking the GPUs there leaves whole the group of one model that a gang
    # of the tenant queued behind the job needs (a single that took a GPU out of the only
    # borrowed pair of a model left the pair behind it nothing to reclaim). 0: progress alone.
    reclaim_loss_margin_s: float = 600.0
    # How a one-GPU job's GPU (and a one-node gang's node) is chosen among those that fit without
    # over-committing: "fgd" (FGD's fragmentation gradient, ``fragmentation_score``) or "tightest"
    # (no gradient: least room left, fullest node, BestFit's leftover, tightest memory).
    placement_score: str = "fgd"
    # Turnover among borrowers (``turnover.py``): a borrower that has had less than this many
    # GPU-seconds of service, and finds no GPU but one it would over-commit, preempts instead the
    # most served checkpointing borrower past it (Tiresias' first queue: one GPU-hour). 0: never.
    borrower_turnover_gpu_s: float = 3600.0
    # ... and so does a fresh borrower that finds no room at all (a gang, or a GPU's memory full),
    # as Tiresias' LAS does: without it, 20-minute 32-GPU jobs of the Philly 2017-12-01 window
    # waited 37 h behind borrowers of days.
    turnover_when_blocked: bool = True
    # A one-GPU borrower that over-commits its GPU (throttled beside a guaranteed job, or slowed by
    # another borrower) while a GPU of its model stays empty after both passes is preempted to
    # restart there alone, if it checkpoints: a borrower placed when the cluster was full otherwise
    # crawled at the duty cycle floor for the rest of its run (a 5.5 h job took 43 h).
    move_crowded_borrowers: bool = True
    # Turnover's victims go most served first (GPU-seconds in all, earlier runs included), as LAS
    # takes them; False: least progress lost first (the shortest current run), as a guarantee's
    # reclaim takes them. Five Philly windows at interference 0.35, 5 seeds: geo-mean of average
    # JCT over LAS's 1.017 -> 1.007 (mid Nov 1.053 -> 1.023), no window worse.
    turnover_most_served_first: bool = True
    # On a saturated GPU shared only by one-GPU borrowers, the least served runs at the ceiling and
    # the others at this duty cycle (``duty_cycles``: least attained service inside a GPU). 0 or
    # the ceiling: off.
    borrower_yield_duty: float = 0.6
