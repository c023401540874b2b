"""The agent's isolation layer: how jobs that share a GPU are kept from hurting each other.

Per GPU, one mode (reported in the node's inventory, ``GpuInfo.isolation``):

- ``mps``: a CUDA MPS control daemon per GPU; each single-GPU job gets its memory pinned and its
  SMs capped (:mod:`.mps`);
- ``memory_limit``: each job in a cgroup of its own (:mod:`.cgroups`) with the driver's hard and
  soft memory limits on its GPUs (:mod:`.memory_limits`);
- ``mig``: a MIG instance, fenced in hardware; the job sees it by its ``MIG-...`` UUID;
- ``unfenced``: nothing enforces a share.

Whatever the GPU's mode, every job also gets a cgroup of its own where the node can make them
(:mod:`.cgroups`: killed whole at the job's end, host memory and CPU limits) with a device filter
(:mod:`.devices`, :mod:`.bpf`: the job opens only its own GPUs' device nodes, whatever
``CUDA_VISIBLE_DEVICES`` says). :attr:`IsolationLayer.fencing` (:class:`NodeFencing`) says which of
these the node has and why not, for the agent to report a node without them as unfenced.

:mod:`.choose` picks the modes from the operator's ``--isolation`` flag and what the node offers;
:mod:`.layer` is what the runner (fences for launches, cleanup) and the agent (MPS faults, the
wording of an allocation failure) use. No Django, no Redis here.
"""

from agents.isolation.choose import FLAGS, IsolationUnavailable, configure
from agents.isolation.layer import IsolationError, IsolationLayer, JobFence, MpsFault, NodeFencing

__all__ = ["FLAGS", "IsolationError", "IsolationLayer", "IsolationUnavailable", "JobFence", "MpsFault",
           "NodeFencing", "configure"]
