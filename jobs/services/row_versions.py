"""Rows kept between scheduling cycles by their PostgreSQL row version (``xmin``), so that each
cycle reads again only the rows written since. Used for the pending jobs (snapshot) and their
stored verdicts (apply): 50,000 rows a cycle, most of them unchanged."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection

_MISSING = ("",)
_generations = itertools.count()


def own_xid() -> str | None:
    """The 32-bit id of the current transaction, if it has written anything (as ``xmin`` reads)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current_if_assigned() % 4294967296")
        own = cursor.fetchone()[0]
    return None if own is None else str(own)


class RowVersions:
    """What was last read of each row, with the version it was read at. A row whose version did not
    move still holds it. A version written by the reading transaction itself is never kept: that
    transaction may change the row again under the same version."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[str, Any]] = {}
        self._values: dict[int, Any] = {}
        # The versions of the last read, while ``_values`` is exactly what they read and all of
        # it is kept: the same list again (a comparison at C speed) is answered without a look
        # at each of 50,000 rows.
        self._last: list[tuple[int, str]] | None = None
        # Moves whenever what ``read`` returns may have changed (a caller may key its own
        # derived work on it); never the same for two instances.
        self.generation = next(_generations)

    def read(self, versions: list[tuple[int, str]],
             fetch: Callable[[list[str]], Iterable[tuple[int, str, Any]]]) -> dict[int, Any]:
        """``versions``: (id, xmin as text) of every row wanted now. ``fetch(ids)``: (id, version,
        value) of those rows, version and value read in one statement. Returns id -> value, in the
        order of ``versions`` (rows gone between the two reads are left out)."""
        if versions == self._last:
            return self._values
        seen = self._seen
        stale = [str(row_id) for row_id, version in versions if seen.get(row_id, _MISSING)[0] != version]
        if not stale and len(versions) == len(seen) == len(self._values):
            self._last = versions
            return self._values  # every row as last read and kept, and no other
        read = {row_id: (version, value) for row_id, version, value in fetch(stale)} if stale else {}
        own = own_xid()
        kept: dict[int, tuple[str, Any]] = {}
        values: dict[int, Any] = {}
        for row_id, _ in versions:
            known = read.get(row_id) or seen.get(row_id)
            if known is None:
                continue
            values[row_id] = known[1]
            if known[0] != own:
                kept[row_id] = known
        self._seen, self._values = kept, values
        self.generation = next(_generations)
        self._last = versions if len(kept) == len(values) == len(versions) else None
        return values

    def remember(self, written: Iterable[tuple[int, str, Any]]) -> None:
        """Rows this process has just written, as (id, version, value), so that the next read
        need not fetch them back. Call it only once the (sub)transaction that wrote them has ended
        for good, in ``transaction.on_commit``: until then it could change them again under the
        same version. A row that is changed or gone later reads as stale or missing as usual."""
        for row_id, version, value in written:
            self._last = None
            self.generation = next(_generations)
            self._seen[row_id] = (version, value)
            self._values[row_id] = value
