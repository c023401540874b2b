"""Filters for job lists, shared by the queue page and the queue API so both read the same
parameters the same way. They only narrow a queryset that already went through
``Job.objects.visible_to(user)``: a filter can never widen what a user sees.

Parameters (all optional, comma-separated lists allowed):
``tenant`` (slugs), ``state`` (states, or ``active`` = pending/placed/running/cancelling/preempting,
``finished`` = succeeded/failed/cancelled/timeout), ``owner`` (usernames, or ``me``), ``array``
(array ids). One value each: ``name`` (a shell-style pattern: ``*`` any text, ``?`` one character,
the rest as written), ``finished_after`` (an ISO 8601 time; no zone means UTC), ``ordering``
(``-submitted_at``, the default, or ``-finished_at``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from django.utils.dateparse import parse_datetime

from jobs.choices import ACTIVE_STATES, TERMINAL_STATES, JobState

STATE_GROUPS = {
    "active": (JobState.PENDING, *ACTIVE_STATES),
    "finished": TERMINAL_STATES,
}


ORDERINGS = {"-submitted_at": ("-submitted_at", "-id"), "-finished_at": ("-finished_at", "-id")}


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@dataclass(frozen=True)
class JobFilter:
    tenants: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    unknown_states: tuple[str, ...] = ()
    arrays: tuple[int, ...] = ()
    name_pattern: str = ""
    finished_after: datetime | None = None
    ordering: str = ""
    problems: dict[str, str] = field(default_factory=dict)  # parameter -> why it cannot be read

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
        problems = {}
        finished_after = None
        if params.get("finished_after"):
            finished_after = _time(params["finished_after"])
            if finished_after is None:
                problems["finished_after"] = "Not a time: give ISO 8601, e.g. 2026-01-31T09:00:00Z."
        ordering = (params.get("ordering") or "").strip()
        if ordering and ordering not in ORDERINGS:
            problems["ordering"] = f"Order by {' or '.join(ORDERINGS)}."
        return cls(tuple(_split(params.get("tenant"))), tuple(dict.fromkeys(states)), tuple(owners), tuple(unknown),
                   arrays, (params.get("name") or "").strip(), finished_after, ordering, problems)

    def apply(self, jobs):
        if self.tenants:
            jobs = jobs.filter(tenant__slug__in=self.tenants)
        if self.states:
            jobs = jobs.filter(state__in=self.states)
        if self.owners:
            jobs = jobs.filter(owner__username__in=self.owners)
        if self.arrays:
            jobs = jobs.filter(array_id__in=self.arrays)
        if self.name_pattern:
            jobs = jobs.filter(name__regex=name_regex(self.name_pattern))
        if self.finished_after is not None:
            jobs = jobs.filter(finished_at__gte=self.finished_after)
        if self.ordering in ORDERINGS:
            jobs = jobs.order_by(*ORDERINGS[self.ordering])
        return jobs


def name_regex(pattern: str) -> str:
    """A shell-style name pattern as a regular expression both SQLite's (Python's) and
    PostgreSQL's engines read alike: anchored, ``*`` and ``?`` the only wildcards."""
    parts = [".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern]
    return "^" + "".join(parts) + "$"


def _time(text: str) -> datetime | None:
    try:
        moment = parse_datetime(text.strip())
    except ValueError:
        return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment
