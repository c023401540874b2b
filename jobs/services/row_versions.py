"""Rows kept between scheduling cycles by their PostgreSQL row version (``xmin``), so that each
cycle reads again only the rows written since. Used for the pending jobs (snapshot) and their
stored verdicts (apply): 50,000 rows a cycle, most of them unchanged."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connection

_generations = itertools.count()


def own_xid() -> str | None:
    """The 32-bit id of the current transaction, if it has written anything (as ``xmin`` reads)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current_if_assigned() % 4294967296")
        own = cursor.fetchone()[0]
    return None if own is None else str(own)


def listing(table: str, id_column: str, where: str = "", params: Sequence = ()) -> str:
    """``id:xmin`` of every row of ``table`` (quoted) matching ``where``, comma-separated, in one
    value: PostgreSQL joins them, and this process receives one string instead of building a row,
    an int and a string per row (most of a read's CPU at 50,000 rows, and the next garbage
    collection's work)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT string_agg({id_column}::text || ':' || xmin::text, ',') FROM {table} "
                       f"{'WHERE ' + where if where else ''}", params)
        return cursor.fetchone()[0] or ""


class RowVersions:
    """What was last read of each row, with the version it was read at. A row whose version did not
    move still holds it. A version written by the reading transaction itself is never kept: that
    transaction may change the row again under the same version."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, Any]] = {}  # "id:version" -> (id, value read at that version)
        self._key_of: dict[int, str] = {}  # id -> its "id:version" in ``_seen``
        self._values: dict[int, Any] = {}
        # The listing of the last read, while ``_values`` is exactly what it read and all of it is
        # kept: the same text again (one comparison at C speed) is answered without a look at
        # each of 50,000 rows.
        self._last: str | None = None
        # Moves whenever what ``read`` returns may have changed (a caller may key its own
        # derived work on it); never the same for two instances.
        self.generation = next(_generations)

    def read(self, rows: str, fetch: Callable[[list[str]], Iterable[tuple[int, str, Any]]]) -> dict[int, Any]:
        """``rows``: every row wanted now, as :func:`listing` gives them. ``fetch(ids)``: (id,
        version, value) of those rows, version and value read in one statement. Returns id ->
        value, in the order of ``rows`` (rows gone between the two reads are left out)."""
        if rows == self._last:
            return self._values
        items = rows.split(",") if rows else []
        seen = self._seen
        stale = [item for item in items if item not in seen]
        if not stale and len(items) == len(seen) == len(self._values):
            self._last = rows
            return self._values  # every row as last read and kept, and no other
        read = {}
        if stale:
            read = {row_id: (version, value)
                    for row_id, version, value in fetch([item.partition(":")[0] for item in stale])}
        own = own_xid()
        own_suffix = None if own is None else ":" + own
        kept: dict[str, tuple[int, Any]] = {}
        key_of: dict[int, str] = {}
        values: dict[int, Any] = {}
        for item in items:
            found = seen.get(item)
            if found is None:
                row_id = int(item.partition(":")[0])
                fresh = read.get(row_id)
                if fresh is None:
                    continue  # gone since the listing
                version, value = fresh
                values[row_id] = value
                if version != own:
                    key = key_of[row_id] = f"{row_id}:{version}"
                    kept[key] = (row_id, value)
            else:
                row_id = found[0]
                values[row_id] = found[1]
                if own_suffix is None or not item.endswith(own_suffix):
                    kept[item], key_of[row_id] = found, item
        self._seen, self._key_of, self._values = kept, key_of, values
        self.generation = next(_generations)
        self._last = rows if len(kept) == len(values) == len(items) else None
        return values

    def remember(self, written: Iterable[tuple[int, str, Any]]) -> None:
        """Rows this process has just written, as (id, version, value), so that the next read
        need not fetch them back. Call it only once the (sub)transaction that wrote them has ended
        for good, in ``transaction.on_commit``: until then it could change them again under the
        same version. A row that is changed or gone later reads as stale or missing as usual."""
        for row_id, version, value in written:
            self._last = None
            self.generation = next(_generations)
            key = f"{row_id}:{version}"
            before = self._key_of.get(row_id)
            if before is not None and before != key:
                del self._seen[before]  # (the row is at its new version now: no read will list the old)
            self._seen[key], self._key_of[row_id] = (row_id, value), key
            self._values[row_id] = value
