"""Filters for job lists, shared by the queue page and the queue API so both read the same
parameters the same way. They only narrow a queryset that already went through
``Job.objects.visible_to(user)``: a filter can never widen what a user sees.

Parameters (all optional, comma-separated lists allowed):
``tenant`` (slugs), ``state`` (states, or ``active`` = pending/placed/running/cancelling,
``finished`` = succeeded/failed/cancelled), ``owner`` (usernames, or ``me``), ``array`` (array ids).
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, JobState

STATE_GROUPS = {
    "active": (JobState.PENDING, *ACTIVE_STATES),
    "finished": TERMINAL_STATES,
}


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@dataclass(frozen=True)
class JobFilter:
    tenants: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    unknown_states: tuple[str, ...] = ()
    arrays: tuple[int, ...] = ()

    @classmethod
    def from_params(cls, params, user) -> "JobFilter":
        states, unknown = [], []
        for word in _split(params.get("state")):
            if word.lower() in STATE_GROUPS:
                states += STATE_GROUPS[word.lower()]
            elif word.upper() in JobState.values:
                states.append(word.upper())
            else:
                unknown.append(word)
        owners = [user.get_username() if name == "me" else name for name in _split(params.get("owner"))]
        arrays = tuple(int(word) for word in _split(params.get("array")) if word.isdigit())
        return cls(tuple(_split(params.get("tenant"))), tuple(dict.fromkeys(states)), tuple(owners), tuple(unknown),
                   arrays)

    def apply(self, jobs):
        if self.tenants:
            jobs = jobs.filter(tenant__slug__in=self.tenants)
        if self.states:
            jobs = jobs.filter(state__in=self.states)
        if self.owners:
            jobs = jobs.filter(owner__username__in=self.owners)
        if self.arrays:
            jobs = jobs.filter(array_id__in=self.arrays)
        return jobs
