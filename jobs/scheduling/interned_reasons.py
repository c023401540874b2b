"""One object per distinct pending reason, from one cycle to the next (``InternedReasons``).

Tens of thousands of waiting jobs share a few hundred reasons, and most of them are told the same
thing cycle after cycle. Handed out as the very same objects while their words stay the same, a
job whose verdict did not change gets a ``Pending`` equal to its last one at the cost of a pointer
comparison: the scheduling loop finds the few verdicts that changed by comparing two cycles'
verdicts at C speed (``jobs.services.apply``) instead of encoding and comparing every one.

A reason builder is a pure function of its arguments (``reasons``), so a reason built from equal
arguments in an earlier cycle is the one this cycle would build. Some arguments drift while the
words do not (a tenant's usage, rounded in the reason): such a reason is looked up by its words
too. Kept in ``carry.Carry``; past ``KEPT`` entries it starts again rather than grow for as long
as the scheduler process lives.
"""

from __future__ import annotations

from collections.abc import Callable

from jobs.scheduling.reasons import PendingReason

KEPT = 20_000


class InternedReasons:
    def __init__(self) -> None:
        self._by_call: dict[tuple, PendingReason] = {}  # (builder, arguments, their types) -> reason
        self._by_words: dict[tuple, PendingReason] = {}  # (code, message, repr of details) -> reason

    def get(self, build: Callable[..., PendingReason], *args) -> PendingReason:
        """``build(*args)``, or the equal reason handed out before. (The arguments' types are part
        of the key: 2, 2.0 and True are equal, but a reason built from each is worded otherwise.)"""
        key = (build, args, tuple(map(type, args)))
        found = self._by_call.get(key)
        if found is None:
            if len(self._by_call) >= KEPT or len(self._by_words) >= KEPT:
                self._by_call, self._by_words = {}, {}
            found = self._by_call[key] = self.intern(build(*args))
        return found

    def intern(self, reason: PendingReason) -> PendingReason:
        """The reason handed out before with the same words (details compared by their repr: two
        equal dicts written in another order are kept apart, which costs a comparison, not a
        wrong answer), else ``reason`` itself from now on."""
        return self._by_words.setdefault((reason.code, reason.message, repr(reason.details)), reason)
