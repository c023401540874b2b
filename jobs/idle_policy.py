"""A tenant's idle-GPU policy as written: its steps, their order and the rules they must keep.

Read by ``Tenant.clean`` (a policy that cannot be applied is refused where it is edited) and by
:mod:`jobs.services.idle_reclaim`, which applies it. Plain Python on the tenant's fields: no
query, no Redis, so the model can use it without importing a service.
"""

from __future__ import annotations

from dataclasses import dataclass

NOTIFY, OPPORTUNISTIC, SUSPEND, REQUEUE = "notify", "opportunistic", "suspend", "requeue"
ORDER = (NOTIFY, OPPORTUNISTIC, SUSPEND, REQUEUE)
FIELDS = {NOTIFY: "idle_notify_minutes", OPPORTUNISTIC: "idle_opportunistic_minutes",
          SUSPEND: "idle_suspend_minutes", REQUEUE: "idle_requeue_minutes"}
# What the job page says will happen ("at 60 min it is suspended").
WILL = {NOTIFY: "its owner is warned", OPPORTUNISTIC: "it becomes opportunistic (preemptible)",
        SUSPEND: "it is suspended (GPU memory stays held)", REQUEUE: "it is requeued"}


@dataclass(frozen=True)
class Step:
    name: str
    minutes: int

    @property
    def will(self) -> str:
        return WILL[self.name]


def steps_of(tenant) -> list[Step]:
    """The tenant's steps that are on, in order (empty: no policy)."""
    return [Step(name, getattr(tenant, FIELDS[name])) for name in ORDER if getattr(tenant, FIELDS[name]) is not None]


def policy_problems(tenant) -> dict[str, str]:
    """Why the tenant's policy cannot be applied as written (field -> message); empty when fine."""
    problems = {}
    steps = steps_of(tenant)
    for earlier, later in zip(steps, steps[1:]):
        if later.minutes <= earlier.minutes:
            problems[FIELDS[later.name]] = (f"Must be later than the {earlier.name} step ({earlier.minutes} min): "
                                            f"the steps run in the order warn, opportunistic, suspend, requeue.")
    if tenant.idle_suspend_minutes is not None and tenant.idle_requeue_minutes is None:
        problems[FIELDS[REQUEUE]] = ("A suspend step needs a requeue step after it: a stopped process cannot "
                                     "show it is busy again, so it would hold its GPUs until cancelled.")
    return problems
