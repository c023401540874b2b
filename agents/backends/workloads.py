"""Synthetic GPU usage profiles for the simulated backend: what a training, inference or idle job
looks like to NVML over time. Pure functions of the job's progress time and a seed; no clock, no I/O.

A job picks its profile with the environment variable ``COLONY_SIM_WORKLOAD`` (set through
``LaunchJob.env``)::

    train                               # the default
    inference
    idle
    train:mem=20000,util=60,period=5    # a kind with overrides
    mem=20000,util=60,period=5          # overrides of the default kind (train)

Keys: ``mem`` peak MiB per GPU, ``util`` target SM utilisation in percent, ``period`` seconds per
iteration (or per burst window for inference), ``ramp`` seconds from launch to steady state.
Without ``mem`` the peak is 90% of ``LaunchJob.gpu_memory_limit_mib`` when the job has a limit,
else 8 GiB.

Shapes (``t`` is the job's progress time: wall time scaled by its duty cycle):

- ``train``: memory climbs from the CUDA context to 70% of the peak over ``ramp`` while utilisation
  warms up; then every iteration memory saws from 70% to 100% of the peak (activations build up
  through the forward pass, freed after the step) at ``util`` +-5 points.
- ``inference``: loads to a flat peak (weights and a pre-allocated cache) and serves in bursts:
  ~30% of windows run at 3x ``util`` (capped at 100), the rest nearly idle.
- ``idle``: loads to the peak and then holds it at 0% utilisation (a notebook left open).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

WORKLOAD_ENV = "COLONY_SIM_WORKLOAD"
DEFAULT_PEAK_MIB = 8192
#: Share of the memory limit a job without an explicit ``mem`` peaks at.
LIMIT_SHARE = 0.9
#: What a process holds on a GPU as soon as it has a CUDA context.
CONTEXT_MIB = 500
SAWTOOTH_LOW = 0.7
BURST_SHARE = 0.3

KINDS = ("train", "inference", "idle")
_DEFAULTS = {
    #            util  period ramp
    "train": (90.0, 3.0, 10.0),
    "inference": (20.0, 1.0, 3.0),
    "idle": (0.0, 1.0, 2.0),
}


@dataclass(frozen=True)
class Workload:
    kind: str
    peak_mib: int
    util: float
    period_s: float
    ramp_s: float

    def memory_mib(self, t: float) -> int:
        """GPU memory the job holds on each of its GPUs at progress time ``t``."""
        t = max(0.0, t)
        context = min(CONTEXT_MIB, self.peak_mib)
        if self.kind == "train":
            low = SAWTOOTH_LOW * self.peak_mib
            if t < self.ramp_s:
                return int(context + (max(low, context) - context) * t / self.ramp_s)
            phase = ((t - self.ramp_s) % self.period_s) / self.period_s
            return int(max(context, low + (self.peak_mib - low) * phase))
        if t < self.ramp_s:
            return int(context + (self.peak_mib - context) * t / self.ramp_s)
        return self.peak_mib

    def util_percent(self, t: float, seed: int, job_id: int) -> float:
        """SM utilisation the job would cause running alone, at progress time ``t``."""
        t = max(0.0, t)
        if self.kind == "idle" or self.util <= 0:
            return 0.0
        if self.kind == "train":
            if t < self.ramp_s:
                return self.util * (0.1 + 0.9 * t / self.ramp_s)  # data loading, warm-up, compilation
            iteration = int((t - self.ramp_s) // self.period_s)
            return _clip(self.util + 5.0 * noise(seed, job_id, iteration))
        # inference
        if t < self.ramp_s:
            return min(self.util, 5.0)
        window = int((t - self.ramp_s) // self.period_s)
        burst = min(100.0, 3.0 * self.util)
        if (noise(seed, job_id, window, "burst") + 1) / 2 < BURST_SHARE:
            return _clip(burst + 3.0 * noise(seed, job_id, window))
        quiet = max(0.0, (self.util - BURST_SHARE * burst) / (1 - BURST_SHARE))
        return _clip(quiet + 2.0 * noise(seed, job_id, window))


def noise(seed: int, job_id: int, bucket: int, salt: str = "") -> float:
    """A deterministic value in [-1, 1) for one job and time bucket."""
    return random.Random(f"{seed}:{job_id}:{bucket}:{salt}").random() * 2 - 1


def _clip(value: float) -> float:
    return min(100.0, max(0.0, value))


def parse_workload(spec: str | None, gpu_memory_limit_mib: int | None = None) -> Workload:
    """The workload ``spec`` (see the module docstring) describes; raises ``ValueError``."""
    spec = (spec or "").strip()
    kind, _, overrides = spec.partition(":")
    if "=" in kind:  # bare overrides: "mem=20000,util=60"
        kind, overrides = "train", spec
    kind = kind.strip().lower() or "train"
    if kind not in KINDS:
        raise ValueError(f"unknown workload {kind!r}; expected one of {', '.join(KINDS)} or key=value pairs")
    util, period, ramp = _DEFAULTS[kind]
    if gpu_memory_limit_mib:
        peak = max(1, int(gpu_memory_limit_mib * LIMIT_SHARE))
    else:
        peak = DEFAULT_PEAK_MIB
    workload = Workload(kind=kind, peak_mib=peak, util=util, period_s=period, ramp_s=ramp)
    for pair in filter(None, (part.strip() for part in overrides.split(","))):
        key, sep, value = pair.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"expected key=value, got {pair!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{key}: not a number: {value.strip()!r}") from None
        if key == "mem":
            if not 1 <= number <= 10_000_000:
                raise ValueError(f"mem must be a positive number of MiB, got {value.strip()}")
            workload = replace(workload, peak_mib=int(number))
        elif key == "util":
            if not 0 <= number <= 100:
                raise ValueError(f"util must be a percentage 0-100, got {value.strip()}")
            workload = replace(workload, util=number)
        elif key == "period":
            if not 0 < number <= 86_400:
                raise ValueError(f"period must be positive seconds, got {value.strip()}")
            workload = replace(workload, period_s=number)
        elif key == "ramp":
            if not 0 <= number <= 86_400:
                raise ValueError(f"ramp must be seconds >= 0, got {value.strip()}")
            workload = replace(workload, ramp_s=number)
        else:
            raise ValueError(f"unknown key {key!r}; expected mem, util, period or ramp")
    return workload
