"""Job states and tenant roles."""

from django.db import models


class JobState(models.TextChoices):
    PENDING = "PENDING", "Pending"
    PLACED = "PLACED", "Placed"  # GPUs allocated, launch command sent, not yet started
    RUNNING = "RUNNING", "Running"
    CANCELLING = "CANCELLING", "Cancelling"  # stop sent, waiting for the agent to confirm
    PREEMPTING = "PREEMPTING", "Preempting"  # stopped to make room; back to PENDING once it exits
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    TIMEOUT = "TIMEOUT", "Timed out"  # ran past its max_runtime_s and was stopped


# States in which a job holds GPUs.
ACTIVE_STATES = (JobState.PLACED, JobState.RUNNING, JobState.CANCELLING, JobState.PREEMPTING)
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
CANCELLABLE_STATES = (JobState.PENDING, JobState.PLACED, JobState.RUNNING, JobState.PREEMPTING)


class Role(models.TextChoices):
    RESEARCHER = "researcher", "Researcher"
    LEAD = "lead", "Tenant lead"


class RunClass(models.TextChoices):
    GUARANTEED = "guaranteed", "Guaranteed"  # inside the tenant's guarantee; never preempted
    OPPORTUNISTIC = "opportunistic", "Opportunistic"  # borrowing; may be throttled or preempted


class JobEventKind(models.TextChoices):
    """Steps of a job's timeline (``JobEvent``), each written by the lifecycle."""

    SUBMITTED = "submitted", "Submitted"
    PLACED = "placed", "Placed"
    STARTED = "started", "Started"
    STOPPING = "stopping", "Stopping"  # told to stop: cancel, preemption, operator requeue, time out
    REQUEUED = "requeued", "Back in the queue"
    FINISHED = "finished", "Finished"
    IDLE = "idle", "Idle"  # a step of its tenant's idle-GPU policy: warned, made opportunistic, suspended
