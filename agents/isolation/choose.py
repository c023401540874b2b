"""Which isolation mode each GPU of the node gets, from the operator's flag and what the node has.

``--isolation auto`` (the default), per GPU, the first that holds:

1. a MIG instance (the backend reports it so) stays ``mig``;
2. a backend that enforces a mode itself (``native_isolation``, the simulated backend) gives it;
3. ``memory_limit`` when the driver enforces per-cgroup limits on that GPU (probed, never assumed)
   and jobs can get a cgroup of their own (cgroup v2, a subtree this agent may write);
4. ``mps`` when ``nvidia-cuda-mps-control`` is there, jobs do not run under per-tenant accounts
   (MPS runs one server per uid per GPU: jobs of different uids would be serialised, not shared),
   and the GPU's control daemon starts;
5. else ``unfenced``.

Whatever the modes, every job gets a cgroup of its own where the node can make them, with a
device filter (a job opens only its own GPUs' device nodes) and host memory/CPU limits where the
controllers are there (:func:`job_fencing`); what is missing is logged and reported in
``IsolationLayer.fencing``, for the agent to show the node unfenced. ``--isolation none`` turns
off only the sharing modes, never this.

``--isolation memory-limit`` and ``--isolation mps`` ask for that mode on every GPU that is not a
MIG instance: a node that cannot honour it refuses to start (:class:`IsolationUnavailable`, its
message for the operator). ``--isolation none`` fences nothing. Every choice is logged with why.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

from agents.accounts import RunAsPolicy
from agents.isolation.cgroups import JobCgroups, agent_tag
from agents.isolation.devices import DeviceFence, nvml_mig_lookup
from agents.isolation.layer import IsolationLayer, NodeFencing
from agents.isolation.memory_limits import DriverMemoryLimits
from agents.isolation.mps import MpsDaemons, MpsError, find_control
from agents.protocol import GpuInfo

log = logging.getLogger(__name__)

FLAGS = ("auto", "mps", "memory-limit", "none")


class IsolationUnavailable(RuntimeError):
    """The operator asked for a mode this node cannot give; the message says why."""


def job_accounts(policy: RunAsPolicy) -> tuple[set[int], tuple[int, int] | None]:
    """The uids jobs may run as, and the (uid, gid) MPS directories belong to (None: the agent's)."""
    if not policy.switches_users:
        return {os.getuid()}, None
    accounts = list(policy.tenants.values()) + ([policy.default] if policy.default is not None else [])
    uids = {account.uid for account in accounts}
    if policy.allow_root:
        uids.add(0)  # tenants with no account run as root
    if policy.maps_users:
        uids.add(-1)  # (stands for the researchers' own accounts: as many uids as researchers)
    owner = None
    if len(uids) == 1 and accounts and accounts[0].uid != 0:
        owner = (accounts[0].uid, accounts[0].gid)
    return uids, owner


def configure(flag: str, gpus: list[GpuInfo], *, backend: Any = None, run_as: RunAsPolicy | None = None,
              state_dir: Path, mps_control: str | os.PathLike | None = None, cgroup_root: Path | None = None,
              nvml: Any = None, base_env: Mapping[str, str] | None = None,
              mps_service: tuple[int, int] | None = None,
              mps_server_limits: Mapping[str, str] | None = None) -> IsolationLayer:
    """The node's isolation layer: modes chosen, MPS daemons started. Raises IsolationUnavailable
    when ``flag`` names a mode the node cannot give (nothing is left running then)."""
    if flag not in FLAGS:
        raise ValueError(f"unknown isolation {flag!r}")
    run_as = run_as or RunAsPolicy()
    shareable = [gpu for gpu in gpus if gpu.isolation != "mig"]
    for gpu in gpus:
        if gpu.isolation == "mig":
            log.info("GPU %d: isolation mig (instance %s of GPU %s)", gpu.index, gpu.mig_profile, gpu.parent_index)
    cgroups, devices, fencing = job_fencing(cgroup_root, state_dir, gpus, nvml)
    fenced = {"cgroups": cgroups, "devices": devices, "fencing": fencing}
    if flag == "none" or not shareable:
        for gpu in shareable:
            log.info("GPU %d: isolation unfenced (--isolation none)", gpu.index)
        return IsolationLayer(gpus, {}, **fenced)
    native = getattr(backend, "native_isolation", None)
    wanted = {"mps": "mps", "memory-limit": "memory_limit"}.get(flag)
    if native is not None and wanted in (None, native):
        for gpu in shareable:
            log.info("GPU %d: isolation %s (enforced by the %s backend)", gpu.index, native,
                     getattr(backend, "name", "GPU"))
        return IsolationLayer(gpus, {gpu.index: native for gpu in shareable}, native=True, **fenced)

    modes: dict[int, str] = {}
    why_not: dict[int, list[str]] = {gpu.index: [] for gpu in shareable}
    limits = None
    if wanted in (None, "memory_limit"):
        limits, supported = _memory_limits(shareable, cgroups, nvml, why_not)
        modes.update({index: "memory_limit" for index in supported})
        if wanted == "memory_limit" and len(supported) < len(shareable):
            if limits is not None:
                limits.close()
            raise IsolationUnavailable("--isolation memory-limit: " + _reasons(why_not, supported))
    mps = None
    rest = [gpu for gpu in shareable if gpu.index not in modes]
    if rest and wanted in (None, "mps"):
        mps = _mps(rest, run_as, state_dir, mps_control, base_env, why_not, strict=wanted == "mps",
                   service=mps_service, server_limits=mps_server_limits)
        if mps is not None:
            modes.update({index: "mps" for index in mps.daemons})
    if limits is not None and "memory_limit" not in modes.values():
        limits.close()
        limits = None
    for gpu in shareable:
        mode = modes.get(gpu.index, "unfenced")
        detail = "" if mode != "unfenced" else " (" + "; ".join(why_not[gpu.index] or ["nothing to enforce with"]) + ")"
        log.info("GPU %d: isolation %s%s", gpu.index, mode, detail)
    return IsolationLayer(gpus, modes, mps=mps, limits=limits, **fenced)


def job_fencing(cgroup_root: Path | None, state_dir: Path, gpus: list[GpuInfo], nvml: Any = None):
    """The node's job cgroups and device filter, probed: ``(cgroups, devices, NodeFencing)``;
    each part that is missing is logged with why."""
    cgroups, why = JobCgroups.detect(cgroup_root, tag=agent_tag(state_dir))
    if cgroups is None:
        reason = f"jobs get no cgroup of their own: {why}"
        log.warning("node unfenced: %s; a job's daemons can outlive it and it can open every GPU's device", reason)
        return None, None, NodeFencing(reasons=(reason,))
    reasons = []
    missing_limits = cgroups.enable_limits()
    if missing_limits:
        reasons.append(missing_limits)
        log.warning("%s", missing_limits)
    lookup = None
    if any(gpu.mig_profile for gpu in gpus):
        lookup = _mig_lookup(nvml)
    devices = DeviceFence(mig_lookup=lookup)
    try:
        scratch = cgroups.scratch()
    except OSError as exc:
        reason = f"jobs get no cgroup of their own: cannot create one under {cgroups.root}: {exc.strerror or exc}"
        log.warning("node unfenced: %s", reason)
        return None, None, NodeFencing(reasons=(reason,))
    try:
        devices.probe(scratch)
    finally:
        cgroups.discard(scratch)
    if not devices.available:
        reasons.append(f"no device filter: {devices.why_not}")
        log.warning("node unfenced: jobs can open every GPU's device node (%s)", devices.why_not)
    fencing = NodeFencing(cgroups=True, devices=devices.available, limits=bool(cgroups.controllers),
                          reasons=tuple(reasons))
    log.info("jobs get cgroups under %s: %s", cgroups.root, fencing.summary())
    return cgroups, devices, fencing


def _mig_lookup(nvml: Any):
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None
    try:
        nvml.nvmlInit()  # counted: the backend's own init and shutdown are unaffected
    except Exception:
        return None
    return nvml_mig_lookup(nvml)


def _memory_limits(gpus: list[GpuInfo], cgroups: JobCgroups | None, nvml: Any, why_not: dict[int, list[str]]):
    if cgroups is None:
        for gpu in gpus:
            why_not[gpu.index].append("no driver memory limits: jobs cannot get a cgroup of their own")
        return None, []
    limits, why = DriverMemoryLimits.load(nvml)
    if limits is None:
        for gpu in gpus:
            why_not[gpu.index].append(f"no driver memory limits: {why}")
        return None, []
    supported = []
    for gpu in gpus:
        ok, why = limits.probe(gpu.uuid, cgroups.root)
        if ok:
            supported.append(gpu.index)
        else:
            why_not[gpu.index].append(f"no driver memory limits: {why}")
    return limits, supported


def _mps(gpus: list[GpuInfo], run_as: RunAsPolicy, state_dir: Path, control_path, base_env,
         why_not: dict[int, list[str]], *, strict: bool, service: tuple[int, int] | None = None,
         server_limits: Mapping[str, str] | None = None) -> MpsDaemons | None:
    control = find_control(control_path)
    uids, owner = job_accounts(run_as)
    refusal = None
    if control is None:
        refusal = f"no MPS: {control_path or 'nvidia-cuda-mps-control'} is not an executable" + (
            "" if control_path else " on PATH")
    elif len(uids) > 1:
        refusal = ("no MPS: jobs run under several accounts (per-tenant accounts, or their researchers' own), "
                   "and MPS runs one server per uid per GPU, so jobs of different accounts would be serialised, "
                   "not shared")
    if refusal is not None:
        if strict:
            raise IsolationUnavailable(f"--isolation mps: {refusal.removeprefix('no MPS: ')}")
        for gpu in gpus:
            why_not[gpu.index].append(refusal)
        return None
    if service is not None and service[0] in uids:
        refusal = f"no MPS: its service account (uid {service[0]}) is one jobs run as, so they could quit its daemon"
        if strict:
            raise IsolationUnavailable(f"--isolation mps: {refusal.removeprefix('no MPS: ')}")
        for gpu in gpus:
            why_not[gpu.index].append(refusal)
        return None
    daemons = MpsDaemons(control, state_dir, owner=owner, base_env=base_env, service=service,
                         server_limits=server_limits)
    for gpu in gpus:
        try:
            daemons.start(gpu.index, gpu.uuid)
        except MpsError as exc:
            if strict:
                daemons.stop_all()
                raise IsolationUnavailable(f"--isolation mps: the MPS control daemon of GPU {gpu.index} "
                                           f"did not start: {exc}") from None
            log.warning("GPU %d: the MPS control daemon did not start (%s); falling back", gpu.index, exc)
            why_not[gpu.index].append(f"no MPS: its control daemon did not start: {exc}")
    return daemons if daemons.daemons else None


def _reasons(why_not: dict[int, list[str]], supported: list[int]) -> str:
    return "; ".join(f"GPU {index}: {', '.join(reasons)}" for index, reasons in sorted(why_not.items())
                     if index not in supported)
