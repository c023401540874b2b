"""The node's own hand on borrowers' duty cycles: each GPU reading drives the local coordinator
(:mod:`agents.local_coordinator`), whose moves the runner applies at once, and the control plane's
duty cycle for a borrower is its ceiling there. Other jobs run at what the control plane sends.
"""

from __future__ import annotations

import logging
import time

from agents import protocol
from agents.local_coordinator import LocalCoordinator, Resident

log = logging.getLogger(__name__)


class LocalDuty:
    """The coordinator and the runner it moves. ``changes``: how many times it moved a job."""

    def __init__(self, runner, coordinator: LocalCoordinator):
        self.runner, self.coordinator = runner, coordinator
        self.changes = 0

    def after_reading(self, gpus: list[protocol.GpuSample]) -> None:
        """Let the local coordinator move borrowers from this reading, and apply its moves (the
        sample being built reports them: its ``duty_cycles`` are what each job runs at now)."""
        running = self.runner.running()
        for job_id in self.coordinator.known() - running:
            self.coordinator.forget(job_id)
        for job_id in running:
            self.admit(job_id)
        utilisation = {gpu.index: None if gpu.util_sm is None else gpu.util_sm / 100.0 for gpu in gpus}
        suspended = {job_id for job_id in running if self.runner.duty_cycle(job_id) <= 0}
        for change in self.coordinator.step(time.monotonic(), utilisation, suspended):
            if not self.runner.set_duty_cycle(change.job_id, change.duty_cycle):
                continue  # (ending: nothing to throttle)
            self.changes += 1
            if change.gpu_index is None:
                log.info("job %d (borrower): duty cycle %.2f -> %.2f on this node (%s)", change.job_id,
                         change.before, change.duty_cycle, change.reason)
            else:
                log.info("job %d (borrower): duty cycle %.2f -> %.2f on this node (%s: GPU %d at %.0f%% beside "
                         "guaranteed job %s; ceiling %.2f)", change.job_id, change.before, change.duty_cycle,
                         change.reason, change.gpu_index, 100 * change.utilisation,
                         ", ".join(map(str, change.guaranteed)), self.coordinator.ceiling(change.job_id))

    def admit(self, job_id: int) -> None:
        """Make sure the coordinator knows the running job (launched here, or adopted from an
        earlier agent): its class, GPUs, floor, and the duty cycle the control plane launched it at."""
        if job_id in self.coordinator.known():
            return
        launch = self.runner.launch_of(job_id)
        if launch is None:
            return
        self.coordinator.admit(
            Resident(job_id, launch.job_class, tuple(launch.gpu_indices), launch.duty_cycle_floor, launch.duty_cycle),
            duty_cycle=self.runner.duty_cycle(job_id) or None,  # (0: suspended; it resumes at its launch's)
        )

    def started(self, job_id: int) -> None:
        """A new attempt of the job started here: forget an earlier attempt's (if one ended since
        the last sample) and admit this one."""
        self.coordinator.forget(job_id)
        self.admit(job_id)

    def set_by_control_plane(self, command: protocol.SetDutyCycle) -> bool:
        """The control plane's duty cycle: as sent for most jobs; a borrower's ceiling (it runs at
        most that, and lower while the node holds it down beside a saturated guaranteed job).
        False if the job does not run here."""
        self.admit(command.job_id)
        duty = self.coordinator.set_ceiling(command.job_id, command.duty_cycle)
        if duty is None:
            return self.runner.set_duty_cycle(command.job_id, command.duty_cycle)
        if duty < command.duty_cycle:
            log.info("job %d (borrower): the control plane's duty cycle %.2f is its ceiling; the node holds it at "
                     "%.2f", command.job_id, command.duty_cycle, duty)
        return self.runner.set_duty_cycle(command.job_id, duty)
