"""The wire schema between node agents and the control plane.

Both ends import this module: the agent to write and read messages, the server (``jobs``,
``monitoring``) to validate what it reads from Redis. It must never import Django.

Every message is one Redis stream entry with a single field ``m`` holding JSON. Each JSON object
carries ``v`` (the protocol version) and ``kind`` (which message it is); anything that does not
parse into one of the models below is rejected with a :class:`ProtocolError` naming the reason, so
the reader can dead-letter it instead of half-applying it.

Every message may carry a second field ``sig``, a MAC over the exact bytes of ``m`` with the
node's key (see :mod:`agents.signing`): an agent signs what it writes, and the control plane MACs
each command it sends, in a domain of its own so that neither can pass for the other. Parsing here
does not check it; the server verifies an agent message against the node it names before applying
anything, and an agent refuses a command that is unsigned, forged, stale or for another node.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION = 1

# A generous cap: a registration of a 16-GPU node is ~3 KiB, an exit event with its output tail ~9 KiB.
MAX_MESSAGE_BYTES = 64 * 1024
OUTPUT_TAIL_BYTES = 8 * 1024
# The longest runtime limit a job may ask for (a year): bounds every deadline a node computes.
MAX_RUNTIME_S = 366 * 24 * 3600

NODE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

# Bounds of every number an agent sends. A signed message is still untrusted data: a non-finite or
# absurd number must be rejected here, with a reason, instead of failing (or poisoning) whatever
# stores it. Non-finite floats (NaN, Infinity) are refused by every model (``allow_inf_nan``).
UNIX_TIME_MAX = 4_102_444_800.0  # 2100-01-01T00:00:00Z; unix times become datetimes
PID_MAX = 2**22  # Linux's highest pid_max
EXIT_CODE_MIN, EXIT_CODE_MAX = -255, 255  # 0..255, or -signal when a signal ended the process
ID_MAX = 2**63 - 1  # job ids (BIGINT) and sequence numbers
MEMORY_MIB_MAX = 16 * 1024 * 1024  # 16 TiB per GPU; fits the 32-bit columns that store MiB
TEMPERATURE_C_MIN, TEMPERATURE_C_MAX = -100.0, 200.0
POWER_W_MAX = 10_000.0
CLOCK_MHZ_MAX = 100_000
COUNTER_MAX = 2**63 - 1  # ECC error counts
XID_MAX = 2**31 - 1
BANDWIDTH_GBPS_MAX = 100_000.0
MAX_GPUS = 64
CPU_MILLI_MAX = 4096 * 1000  # 4,096 cores
HOST_MEMORY_MIB_MAX = 64 * 1024 * 1024  # 64 TiB

UnixTime = Annotated[float, Field(ge=0, le=UNIX_TIME_MAX, description="unix time, seconds")]
JobId = Annotated[int, Field(gt=0, le=ID_MAX)]
MemoryMib = Annotated[int, Field(ge=0, le=MEMORY_MIB_MAX)]
GpuIndex = Annotated[int, Field(ge=0, lt=MAX_GPUS)]

# Every wire model: unknown fields and non-finite numbers are errors; messages are immutable.
_WIRE_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

# Redis names. Each agent writes only streams of its own node (its events and its metrics) and
# reads only its own command stream, so no node can trim, exhaust or flood another's. The control
# plane copies what nodes write, in order, onto EVENTS_STREAM and METRICS_STREAM (which no node
# may touch), and its readers consume those (``monitoring.services.fanin``).
EVENTS_STREAM = "colony:events"
METRICS_STREAM = "colony:metrics"
DEAD_LETTER_STREAM = "colony:deadletter"
DEAD_LETTER_COUNT_KEY = "colony:deadletter:count"
AGENT_COMMAND_GROUP = "agent"
# Stream field with the MAC of ``m`` by the node's key (agent messages and commands alike).
SIGNATURE_FIELD = "sig"
# Approximate MAXLEN for streams; old entries are trimmed, never the unread ones in practice.
STREAM_MAXLEN = 100_000


def command_stream(node: str) -> str:
    return f"colony:node:{node}:commands"


def node_events_stream(node: str) -> str:
    """Where ``node``'s agent writes its events (registration, job started/exited)."""
    return f"colony:node:{node}:events"


def node_metrics_stream(node: str) -> str:
    """Where ``node``'s agent writes its samples."""
    return f"colony:node:{node}:metrics"


def node_logs_stream(node: str) -> str:
    """Where ``node``'s agent writes the live output of its running jobs (:class:`JobOutput`)."""
    return f"colony:node:{node}:logs"


# The control plane's copy of every node's logs stream (``monitoring.services.fanin``, kind "logs").
LOGS_STREAM = "colony:logs"


def code_key(node: str, sha256: str) -> str:
    """Where the control plane puts an uploaded code archive for ``node``'s agent to fetch: a list
    of chunks (each under Redis's 1 MB bulk limit), expiring, readable only by that node."""
    return f"colony:node:{node}:code:{sha256}"


def heartbeat_key(node: str) -> str:
    return f"colony:node:{node}:heartbeat"


class ProtocolError(ValueError):
    """A message that is not a valid Colony message; ``reason`` says why in one line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Message(BaseModel):
    model_config = _WIRE_CONFIG
    v: Literal[1] = PROTOCOL_VERSION

    @model_validator(mode="before")
    @classmethod
    def _version_on_the_wire(cls, data, info: ValidationInfo):
        # Code may omit `v` when building a message; a message read off the wire must say it.
        if info.context and info.context.get("wire") and isinstance(data, dict) and "v" not in data:
            raise ValueError("missing protocol version 'v'")
        return data


class _NodeMessage(_Message):
    node: str

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not NODE_NAME_RE.match(value):
            raise ValueError("node name must be 1-63 letters, digits, '.', '_' or '-'")
        return value


# ---------------------------------------------------------------- agent -> control plane events


# How jobs that share one device are kept from hurting each other (``agents.isolation``):
# ``mps``: a CUDA MPS server per GPU pins each client's memory and compute share; ``memory_limit``:
# the driver enforces a hard memory limit per job; ``mig``: the device is a MIG instance, fenced in
# hardware from the rest of its GPU (one job per instance); ``unfenced``: nothing enforces a share,
# so only jobs that accept it are packed together.
Isolation = Literal["mps", "memory_limit", "mig", "unfenced"]
ISOLATION_MODES: tuple[str, ...] = ("mps", "memory_limit", "mig", "unfenced")
MIG_PROFILE_RE = r"^[1-9][0-9]?(?:c\.[1-9][0-9]?)?g\.[0-9]{1,4}gb(?:\+[a-z]{1,8})?$"  # 1g.10gb, 1c.2g.20gb, 1g.10gb+me


# Fences of the node itself, each job's own: ``cgroup``, a cgroup v2 of its own, killed whole when
# it ends (nothing it started outlives it); ``devices``, a device filter that lets it open only its
# own GPUs; ``accounts``, it runs as its researcher's own account (not one shared by its tenant,
# nor the agent's).
JobFenceKind = Literal["cgroup", "devices", "accounts"]
JOB_FENCES: tuple[str, ...] = ("cgroup", "devices", "accounts")


class GpuInfo(BaseModel):
    """One schedulable device: a whole GPU, or one MIG instance of a GPU in MIG mode."""

    model_config = _WIRE_CONFIG
    index: GpuIndex
    uuid: str = Field(min_length=1, max_length=128)
    model: str = Field(min_length=1, max_length=64)
    memory_mib: int = Field(gt=0, le=MEMORY_MIB_MAX)
    # An agent that says nothing enforces nothing.
    isolation: Isolation = "unfenced"
    # MIG instances only: the GPU instance profile (``1g.10gb``) and the NVML index of the GPU it
    # lives on; ``uuid`` is then the instance's ``MIG-...`` UUID, which CUDA_VISIBLE_DEVICES takes.
    mig_profile: str | None = Field(default=None, pattern=MIG_PROFILE_RE)
    parent_index: GpuIndex | None = None

    @model_validator(mode="after")
    def _mig_fields_together(self) -> "GpuInfo":
        is_mig = self.isolation == "mig"
        if is_mig != (self.mig_profile is not None) or is_mig != (self.parent_index is not None):
            raise ValueError("a MIG instance has isolation 'mig', a mig_profile and a parent_index; other GPUs none")
        return self


class GpuLink(BaseModel):
    """How two GPUs of one node talk: ``nvlink`` (with link count), ``pcie`` levels, or ``system``."""

    model_config = _WIRE_CONFIG
    a: GpuIndex
    b: GpuIndex
    kind: Literal["nvlink", "same_board", "pcie_switch", "pcie_host_bridge", "system", "unknown"]
    bandwidth_gbps: float | None = Field(default=None, ge=0, le=BANDWIDTH_GBPS_MAX)


class NodeRegistered(_NodeMessage):
    """Sent when an agent starts (and whenever it reconnects): what the node has and runs.

    ``running_jobs`` lets the server reconcile: a job it no longer believes runs here is stopped.
    """

    kind: Literal["node_registered"] = "node_registered"
    gpus: list[GpuInfo] = Field(max_length=MAX_GPUS)
    topology: list[GpuLink] = Field(default_factory=list, max_length=MAX_GPUS * MAX_GPUS)
    backend: str = Field(max_length=32)
    agent_version: str = Field(max_length=32)
    hostname: str = Field(max_length=255)
    running_jobs: list[JobId] = Field(default_factory=list, max_length=4096)
    # Container runtimes this node runs ``image`` jobs with (its agent's ``--container-runtime``):
    # the scheduler places an image job only on a node that names one.
    runtimes: list[Literal["docker", "podman", "apptainer"]] = Field(default_factory=list, max_length=3)
    # CPU (milli-cores) and host memory (MiB) the node offers jobs, after what the agent keeps for
    # the system; None: not reported, so the scheduler does not count them on this node.
    cpu_milli: int | None = Field(default=None, ge=0, le=CPU_MILLI_MAX)
    host_memory_mib: int | None = Field(default=None, ge=0, le=HOST_MEMORY_MIB_MAX)
    # What fences every job on the node, whatever its GPUs' modes (:data:`JOB_FENCES`). A node that
    # lists no ``cgroup`` is shown as unfenced: there a job's processes can outlive it.
    job_fences: list[JobFenceKind] = Field(default_factory=list, max_length=len(JOB_FENCES))


class JobStarted(_NodeMessage):
    kind: Literal["job_started"] = "job_started"
    job_id: JobId
    pid: int = Field(gt=0, le=PID_MAX)
    started_at: UnixTime
    # The command id of the LaunchJob this run came from: which attempt of the job it is.
    launch_id: str | None = Field(default=None, max_length=64)


class JobExited(_NodeMessage):
    """A job's process group is gone. ``stopped`` is true when a stop command (or the agent) ended it.

    ``exit_code`` is the process's code, or ``-signal`` when a signal killed it; ``None`` with an
    ``error`` means the process could not be started at all.
    """

    kind: Literal["job_exited"] = "job_exited"
    job_id: JobId
    exit_code: int | None = Field(ge=EXIT_CODE_MIN, le=EXIT_CODE_MAX)
    stopped: bool = False
    oom: bool = False  # killed because its GPU ran out of memory
    # Stopped by its node because it ran past the launch's ``max_runtime_s`` (stop signal, grace, SIGKILL).
    timed_out: bool = False
    # The node ended the job for reasons of its own (its agent restarted or shut down), not the
    # job: the control plane puts it back in the queue instead of failing it.
    requeue: bool = False
    # Why, when it was not the agent stopping: ``gpu_sharing_fault``, a fault in a job sharing its
    # GPU's MPS server took every client down (``error`` words it).
    requeue_cause: Literal["gpu_sharing_fault"] | None = None
    # Answer to a stop for a job this node does not run (its launch was lost, or it already
    # ended): settles a job the control plane is stopping, and is ignored for any other (a stale
    # stop must not end a later attempt of the job placed here since).
    absent: bool = False
    # The LaunchJob command id of the run that ended (None: no run, e.g. ``absent``); lets the
    # control plane tell an earlier attempt's exit, re-sent after a Redis restart, from this one's.
    launch_id: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, max_length=2000)
    output_tail: str = Field(default="", max_length=OUTPUT_TAIL_BYTES)
    finished_at: UnixTime


class CommandRejected(_NodeMessage):
    """The node refused an entry of its command stream (malformed, unsigned, stale, for another
    node ...) or failed to apply it. The control plane dead-letters it with the reason: a node
    may write nothing but its own streams, so this is how its refusals reach operators.
    No excerpt of the entry travels: even one that does not parse may hold a job's ``env``."""

    kind: Literal["command_rejected"] = "command_rejected"
    entry_id: str = Field(max_length=64)
    reason: str = Field(max_length=500)


AgentEvent = Annotated[Union[NodeRegistered, JobStarted, JobExited, CommandRejected], Field(discriminator="kind")]

# ---------------------------------------------------------------- agent -> control plane metrics
# One NodeSample per node per interval on METRICS_STREAM. Any reading the GPU cannot give (not
# supported on the model, NVML error) is None: "unknown", never a made-up zero.


class GpuSample(BaseModel):
    model_config = _WIRE_CONFIG
    index: GpuIndex
    util_sm: float | None = Field(default=None, ge=0, le=100, description="percent")
    util_mem: float | None = Field(default=None, ge=0, le=100, description="memory controller busy, percent")
    mem_used_mib: MemoryMib | None = None
    mem_total_mib: MemoryMib | None = None
    temperature_c: float | None = Field(default=None, ge=TEMPERATURE_C_MIN, le=TEMPERATURE_C_MAX)
    power_w: float | None = Field(default=None, ge=0, le=POWER_W_MAX)
    sm_clock_mhz: int | None = Field(default=None, ge=0, le=CLOCK_MHZ_MAX)
    mem_clock_mhz: int | None = Field(default=None, ge=0, le=CLOCK_MHZ_MAX)
    ecc_uncorrected: int | None = Field(default=None, ge=0, le=COUNTER_MAX, description="volatile total")
    xid_events: list[Annotated[int, Field(ge=0, le=XID_MAX)]] = Field(
        default_factory=list, max_length=64, description="XID codes since last sample"
    )


class JobGpuSample(BaseModel):
    """GPU memory (and utilisation where known) of one job's processes on one GPU."""

    model_config = _WIRE_CONFIG
    job_id: JobId
    gpu_index: GpuIndex
    mem_used_mib: MemoryMib
    util_sm: float | None = Field(default=None, ge=0, le=100)


class NodeSample(_NodeMessage):
    kind: Literal["node_sample"] = "node_sample"
    ts: UnixTime = Field(description="unix time the sample was taken")
    seq: int = Field(ge=0, le=ID_MAX, description="counts up per agent process; gaps mean lost samples")
    gpus: list[GpuSample] = Field(max_length=MAX_GPUS)
    jobs: list[JobGpuSample] = Field(default_factory=list, max_length=4096)
    # Memory held by processes the agent did not launch, per GPU index.
    unattributed_mib: dict[GpuIndex, MemoryMib] = Field(default_factory=dict, max_length=MAX_GPUS)
    running_jobs: list[JobId] = Field(default_factory=list, max_length=4096)
    # The attempt (LaunchJob command id) of each running job: the control plane reconciles
    # against it, so a job it believes runs here that the node does not run is settled quickly.
    running_launches: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=4096)
    # The duty cycle each of ``running_jobs`` runs at here, in the same order (0: suspended): the
    # control plane re-sends a duty cycle that did not arrive. A list of another length (an agent
    # from before it was sent: none) is not read.
    duty_cycles: list[Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=list, max_length=4096)

# ---------------------------------------------------------------- agent -> control plane output
# Live output of running jobs, on the node's own logs stream: never mixed with events or samples,
# so a chatty job can delay only other output, never an exit or a sample.

# Bytes of a job's output.log one JobOutput carries (its ``data`` is that many characters at most;
# JSON escapes keep the message under MAX_MESSAGE_BYTES even for control characters).
OUTPUT_CHUNK_BYTES = 8 * 1024
OUTPUT_OFFSET_MAX = 2**48  # far beyond any bounded output.log


class JobOutput(_NodeMessage):
    """New output of a running job: ``length`` bytes of its ``output.log`` from byte ``offset``,
    decoded as UTF-8 (invalid bytes replaced). ``gap``: output before this chunk was not shipped
    (the job wrote faster than the node ships, the log was compacted, or the agent restarted)."""

    kind: Literal["job_output"] = "job_output"
    job_id: JobId
    launch_id: str | None = Field(default=None, max_length=64)
    offset: int = Field(ge=0, le=OUTPUT_OFFSET_MAX)
    length: int = Field(ge=0, le=OUTPUT_CHUNK_BYTES)
    gap: bool = False
    data: str = Field(max_length=OUTPUT_CHUNK_BYTES)


# ---------------------------------------------------------------- control plane -> agent commands
# The control plane MACs each command with the target node's key (``sig``, see
# :func:`agents.signing.sign_command`) and puts inside the MAC the node it is for and when it was
# issued; a launch also names its attempt. An agent holding a key refuses a command that is
# unsigned, wrongly signed, for another node, outside its freshness window, or a launch of an
# attempt not newer than one it has seen for the job. Both fields are optional on the wire only
# so that an agent without a key (authentication off) still takes a bare command.

# The latest ``issued_at`` a command may carry (the year 2286): bounds what a node compares.
MAX_ISSUED_AT = 1e10
MAX_ATTEMPT = 1_000_000
# An uploaded code archive: at most this many compressed bytes (the server refuses bigger uploads).
CODE_MAX_BYTES = 32 * 1024 * 1024
CODE_CHUNK_BYTES = 512 * 1024
# The longest preemption notice a launch may carry (an operator sets a lower ceiling).
MAX_PREEMPT_GRACE_S = 3600
# Signals a job may ask to be told to stop with (checkpointing libraries listen for one of these).
StopSignal = Literal["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"]
# How the control plane admitted a job: inside its tenant's guarantee, or borrowing (opportunistic).
JobClass = Literal["guaranteed", "opportunistic"]
# The lowest duty cycle a node cuts a borrower to on its own when the launch names none (the
# scheduler's default ``duty_cycle_floor``); below it only the control plane goes (a suspension).
DEFAULT_DUTY_CYCLE_FLOOR = 0.1
_NODE_PATH = r"^/[^\x00]{0,1023}$"
# A POSIX account name as useradd and NSS/LDAP take it (a trailing $ is a Samba machine account).
POSIX_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"

# Variables a job's spec may not set: they change who the job is (its account's HOME, USER,
# LOGNAME and SHELL are set by its node) or what runs inside it (the dynamic loader's LD_*: an
# LD_PRELOAD'ed library runs in every program the job starts, setuid helpers included where the
# loader honours it). The control plane refuses them at submission and the node again at launch,
# unless its operator allows a name (a site that needs LD_LIBRARY_PATH for a CUDA toolkit, say).
IDENTITY_ENV = ("HOME", "USER", "LOGNAME", "SHELL")
LOADER_ENV_PREFIX = "LD_"


def identity_env_names(names, allowed=()) -> list[str]:
    """The names among ``names`` a job may not set (sorted), less those in ``allowed``."""
    allowed = set(allowed)
    return sorted(name for name in names if name not in allowed
                  and (name in IDENTITY_ENV or name.startswith(LOADER_ENV_PREFIX)))


class _Command(_Message):
    node: str | None = None
    issued_at: float | None = Field(default=None, ge=0, le=MAX_ISSUED_AT, allow_inf_nan=False)

    @field_validator("node")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not NODE_NAME_RE.match(value):
            raise ValueError("node name must be 1-63 letters, digits, '.', '_' or '-'")
        return value


class CodeRef(BaseModel):
    """An uploaded code archive (gzipped tar) the job starts in an unpacked copy of. The node reads
    ``chunks`` entries of :func:`code_key` and checks the bytes against ``sha256`` before unpacking."""

    model_config = _WIRE_CONFIG
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(gt=0, le=CODE_MAX_BYTES)
    chunks: int = Field(gt=0, le=CODE_MAX_BYTES // CODE_CHUNK_BYTES + 1)


class LaunchJob(_Command):
    """Start ``argv`` (no shell) with ``CUDA_VISIBLE_DEVICES`` set to ``gpu_indices``.

    ``gpu_memory_limit_mib`` is what the job may use per GPU (the simulated GPU enforces it as an
    OOM; NVML nodes report overuse); ``duty_cycle`` < 1 starts it throttled. ``user`` (and
    ``posix_user``) name the submitter, whose own account the node runs the job as; ``tenant`` (the
    tenant's slug) picks the fallback account an operator may configure (``--run-as-tenant``).
    There is deliberately no shell or account to ask for: the node maps the submitter to one. ``workdir`` (an
    absolute directory on the node, say a shared filesystem) or ``code`` (an uploaded archive,
    unpacked into the job's own folder) only choose where it starts, which the job could do itself.
    ``image`` runs the argv in a container of the node's runtime; ``venv``/``conda`` activate an
    environment on the node by path. ``preempt_grace_s`` and ``stop_signal`` are its notice.

    ``job_class`` says how the job was admitted. The node protects a guaranteed job itself: its
    local coordinator (:mod:`agents.local_coordinator`) cuts the duty cycle of a borrower
    (``opportunistic``) on a GPU that saturates beside a guaranteed job, down to
    ``duty_cycle_floor`` at most, within a second or two and without waiting for the control plane;
    ``duty_cycle`` (and every later :class:`SetDutyCycle`) is then the borrower's ceiling. None
    (a control plane that does not say): the node leaves the job's duty cycle to the control plane.
    """

    kind: Literal["launch"] = "launch"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)
    argv: list[Annotated[str, Field(max_length=4096)]] = Field(min_length=1, max_length=256)
    gpu_indices: list[int] = Field(max_length=64)
    env: dict[str, str] = Field(default_factory=dict)
    # Bounded like every GPU's memory: past it the driver's byte count would wrap (2**44 MiB is 0).
    gpu_memory_limit_mib: int | None = Field(default=None, gt=0, le=MEMORY_MIB_MAX)
    # The job's host memory (MiB) and CPU (milli-cores) on this node, its request's share here: the
    # node caps the job's cgroup at them (memory.max, cpu.max) where those controllers are enabled.
    # None: the job asked for none, and gets no such limit.
    host_memory_mib: int | None = Field(default=None, gt=0, le=HOST_MEMORY_MIB_MAX)
    cpu_milli: int | None = Field(default=None, gt=0, le=CPU_MILLI_MAX)
    duty_cycle: float = Field(default=1.0, gt=0, le=1)
    job_class: JobClass | None = None
    # Borrowers only: the lowest duty cycle the node may cut the job to on its own.
    duty_cycle_floor: float = Field(default=DEFAULT_DUTY_CYCLE_FLOOR, ge=0.01, le=1)
    # The share of each GPU's compute the job is entitled to (its milli-GPUs / 1000); an MPS GPU
    # caps the job's SMs at it (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). None: the whole GPU.
    compute_share: float | None = Field(default=None, gt=0, le=1)
    tenant: str | None = Field(default=None, pattern=r"^[-a-zA-Z0-9_]{1,50}$")
    # Who submitted the job: their Colony user name, and the POSIX account name the control plane
    # knows for them (an identity provider's claim), if any. The node runs the job as that
    # researcher's own account (:class:`agents.accounts.RunAsPolicy`); like every field, both are
    # inside the command's MAC, so nobody but the control plane picks whose account a job gets.
    user: str | None = Field(default=None, pattern=r"^[\w.@+-]{1,150}$")
    posix_user: str | None = Field(default=None, pattern=POSIX_NAME_RE)
    # Wall-clock limit of this attempt, counted by the node from the process start; the node
    # ends the job past it (its ``stop_signal``, then SIGKILL after ``stop_grace_s``) and reports ``timed_out``.
    max_runtime_s: int | None = Field(default=None, gt=0, le=MAX_RUNTIME_S)
    stop_grace_s: float = Field(default=10.0, ge=0, le=600)
    # Requeues + preemptions before this run (the ``N`` of command id ``launch-<job>-<N>``): a node
    # refuses a launch whose attempt is not newer than one it has already seen for the job.
    attempt: int | None = Field(default=None, ge=0, le=MAX_ATTEMPT)
    workdir: str | None = Field(default=None, pattern=_NODE_PATH)
    code: CodeRef | None = None
    image: str | None = Field(default=None,
                              pattern=r"^(?:[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}|/[A-Za-z0-9._/+-]{1,254})$")
    venv: str | None = Field(default=None, pattern=_NODE_PATH)
    conda: str | None = Field(default=None, pattern=_NODE_PATH)
    # Sent at a stop or preemption; SIGKILL follows after the grace (``stop_grace_s``, or for a
    # preemption ``StopJob.grace_seconds``).
    stop_signal: StopSignal = "SIGTERM"
    # The job's index in its array (``COLONY_ARRAY_INDEX``) and the array's id (``COLONY_ARRAY_ID``).
    array_id: int | None = Field(default=None, gt=0, le=ID_MAX)
    array_index: int | None = Field(default=None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _one_place_to_start(self):
        if self.workdir is not None and self.code is not None:
            raise ValueError("give workdir or code, not both")
        if self.venv is not None and self.conda is not None:
            raise ValueError("give venv or conda, not both")
        return self


class StopJob(_Command):
    """Terminate the job's process group: the launch's ``stop_signal``, then SIGKILL after ``grace_seconds``."""

    kind: Literal["stop"] = "stop"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)
    grace_seconds: float = Field(default=10.0, ge=0, le=MAX_PREEMPT_GRACE_S)
    # Stop only this attempt (its LaunchJob command id): a stop meant for an earlier run never
    # ends a later one placed here since. The node answers for that attempt: its real exit if it
    # ran and ended here, ``absent`` if the node does not know it. None: whatever runs.
    launch_id: str | None = Field(default=None, max_length=64)
    # A preemption: before the stop signal the node writes the SIGKILL deadline (unix seconds) to
    # the job's ``COLONY_PREEMPT_FILE``, so it can checkpoint; ``grace_seconds`` is its notice.
    preempt: bool = False


class SetDutyCycle(_Command):
    """Throttle a job from outside: it runs ``duty_cycle`` of each period (SIGSTOP/SIGCONT slicing).

    For a borrower whose launch said so (``LaunchJob.job_class``) it is a ceiling: the node never
    runs the job faster, and may run it slower (down to the launch's ``duty_cycle_floor``) while
    the GPU it shares with a guaranteed job is saturated, raising it back when there is room."""

    kind: Literal["set_duty_cycle"] = "set_duty_cycle"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)
    duty_cycle: float = Field(gt=0, le=1)


class SuspendJob(_Command):
    """Freeze the job's process group (SIGSTOP); its GPU memory stays allocated."""

    kind: Literal["suspend"] = "suspend"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)


class ResumeJob(_Command):
    kind: Literal["resume"] = "resume"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)


class QueryAttempt(_Command):
    """How does attempt ``launch_id`` of the job stand on this node? Touches nothing: the node
    answers with the attempt's JobStarted if it runs it, its JobExited if it ran and ended here
    (an exit lost on the way is recovered), or a JobExited marked ``absent`` if it does not know
    it. The control plane's reconciliation sends it; a stop would end a run the control plane
    merely had stale news of."""

    kind: Literal["query"] = "query"
    command_id: str = Field(min_length=1, max_length=64)
    job_id: int = Field(gt=0)
    launch_id: str = Field(min_length=1, max_length=64)


NodeCommand = Annotated[
    Union[LaunchJob, StopJob, SetDutyCycle, SuspendJob, ResumeJob, QueryAttempt], Field(discriminator="kind")
]

_event_adapter: TypeAdapter = TypeAdapter(AgentEvent)
_command_adapter: TypeAdapter = TypeAdapter(NodeCommand)
_sample_adapter: TypeAdapter = TypeAdapter(NodeSample)
_output_adapter: TypeAdapter = TypeAdapter(JobOutput)


def encode(message: _Message) -> dict[str, str]:
    """The stream entry fields for ``message`` (pass to XADD)."""
    return {"m": message.model_dump_json()}


_MESSAGE_FIELDS = frozenset({"m", b"m"})
# Both directions may carry a signature of ``m``: agents sign what they write, the control plane
# MACs its commands. Anything else is refused.
_AGENT_FIELDS = _MESSAGE_FIELDS | {SIGNATURE_FIELD, SIGNATURE_FIELD.encode()}
_COMMAND_FIELDS = _AGENT_FIELDS


def _payload(fields: dict, allowed: frozenset = _MESSAGE_FIELDS) -> str:
    unexpected = set(fields) - allowed
    if unexpected:
        raise ProtocolError("unexpected stream fields: " + ", ".join(sorted(map(_text, unexpected))))
    raw = fields.get("m", fields.get(b"m"))
    if raw is None:
        raise ProtocolError("missing field 'm'")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("message is not UTF-8") from None
    return raw


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parse(adapter: TypeAdapter, fields: dict, allowed: frozenset = _MESSAGE_FIELDS):
    raw = _payload(fields, allowed)
    try:
        return adapter.validate_json(raw, context={"wire": True})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        raise ProtocolError(f"{where}: {first['msg']}") from None


def decode_event(fields: dict) -> NodeRegistered | JobStarted | JobExited | CommandRejected:
    """Parse one events-stream entry; raises :class:`ProtocolError`."""
    return _parse(_event_adapter, fields, _AGENT_FIELDS)


def decode_command(fields: dict) -> LaunchJob | StopJob | SetDutyCycle | SuspendJob | ResumeJob | QueryAttempt:
    """Parse one command-stream entry; raises :class:`ProtocolError`. The ``sig`` field is allowed
    but not checked here: the agent verifies it (:func:`agents.signing.verify_command`)."""
    return _parse(_command_adapter, fields, _COMMAND_FIELDS)


def decode_sample(fields: dict) -> NodeSample:
    """Parse one metrics-stream entry; raises :class:`ProtocolError`."""
    return _parse(_sample_adapter, fields, _AGENT_FIELDS)


def decode_output(fields: dict) -> JobOutput:
    """Parse one logs-stream entry; raises :class:`ProtocolError`."""
    return _parse(_output_adapter, fields, _AGENT_FIELDS)


# ---------------------------------------------------------------- interactive sessions
# A job whose launch env sets SESSION_IDLE_ENV runs on a pseudo-terminal (``agents.sessions``): the
# control plane relays its user's keystrokes onto the node's session input stream (MACed with the
# node key, in a domain of their own), and the node writes what the terminal printed to a stream
# per job that only it may append to. The flag travels in the env so that a launch, re-sent or
# not, carries everything the node needs; the API sets it, a spec may not (it starts with COLONY_).

SESSION_IDLE_ENV = "COLONY_SESSION_IDLE_S"
SESSION_IDLE_MIN_S = 60
SESSION_IDLE_MAX_S = 7 * 86400
SESSION_INPUT_BYTES = 4096  # raw bytes of keystrokes in one SessionInput
SESSION_OUTPUT_BYTES = 16 * 1024  # raw bytes of terminal output in one SessionOutput
TERMINAL_MAX_CELLS = 10_000


def session_input_stream(node: str) -> str:
    """Keystrokes and window sizes for ``node``'s interactive jobs; the control plane writes it."""
    return f"colony:node:{node}:session-input"


def session_output_stream(node: str, job_id: int) -> str:
    """What job ``job_id``'s terminal printed on ``node``; only that node writes it."""
    return f"colony:node:{node}:session-output:{job_id}"


def session_idle_s(env: dict[str, str]) -> int | None:
    """The idle timeout of an interactive job (from its launch env), or None for a batch job."""
    value = env.get(SESSION_IDLE_ENV)
    if value is None or not value.isdigit():
        return None
    return min(max(int(value), SESSION_IDLE_MIN_S), SESSION_IDLE_MAX_S)


class SessionInput(_Command):
    """Bytes a user typed into job ``job_id``'s terminal (``data``, base64) and/or its new window
    size. ``launch_id`` pins the attempt: a requeued session's next run never gets old keystrokes."""

    kind: Literal["session_input"] = "session_input"
    job_id: int = Field(gt=0, le=ID_MAX)
    launch_id: str = Field(min_length=1, max_length=64)
    data: str = Field(default="", max_length=(SESSION_INPUT_BYTES + 2) // 3 * 4, pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    rows: int | None = Field(default=None, ge=1, le=TERMINAL_MAX_CELLS)
    cols: int | None = Field(default=None, ge=1, le=TERMINAL_MAX_CELLS)


class SessionOutput(_NodeMessage):
    """Bytes job ``job_id``'s terminal printed (``data``, base64); ``eof``: the job ended and this
    is the last of its output."""

    kind: Literal["session_output"] = "session_output"
    job_id: int = Field(gt=0, le=ID_MAX)
    launch_id: str | None = Field(default=None, max_length=64)
    data: str = Field(default="", max_length=(SESSION_OUTPUT_BYTES + 2) // 3 * 4,
                      pattern=r"^[A-Za-z0-9+/]*={0,2}$")
    gap: bool = False
    eof: bool = False


_session_input_adapter: TypeAdapter = TypeAdapter(SessionInput)
_session_output_adapter: TypeAdapter = TypeAdapter(SessionOutput)


def decode_session_input(fields: dict) -> SessionInput:
    """Parse one session-input entry; raises :class:`ProtocolError` (its MAC is the agent's to check)."""
    return _parse(_session_input_adapter, fields, _COMMAND_FIELDS)


def decode_session_output(fields: dict) -> SessionOutput:
    """Parse one session-output entry; raises :class:`ProtocolError`."""
    return _parse(_session_output_adapter, fields, _AGENT_FIELDS)
