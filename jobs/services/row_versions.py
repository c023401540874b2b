"""Rows kept between scheduling cycles by their PostgreSQL row version (``xmin``), so that each
cycle reads again only the rows written since. Used for the pending jobs (snapshot) and their
stored verdicts (apply): 50,000 rows a cycle, most of them unchanged."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connection, transaction

_generations = itertools.count()


def own_xid() -> str | None:
    """The 32-bit id of the current transaction, if it has written anything (as ``xmin`` reads)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid_current_if_assigned() % 4294967296")
        own = cursor.fetchone()[0]
    return None if own is None else str(own)


def listing(table: str, id_column: str, where: str = "", params: Sequence = (), steady: bool = False,
            mark: str = "NULL") -> tuple[str, str | None]:
    """``id:xmin`` of every row of ``table`` (quoted) matching ``where``, comma-separated, in one
    value, in the order the scan found them (the same while the table does not change:
    :func:`steady_scan_order`; ``steady``: the caller saw to that in its transaction already):
    PostgreSQL joins them, and this process receives one string instead of building a row, an
    int and a string per row (most of a read's CPU at 50,000 rows, and the next garbage
    collection's work). With what the SQL expression ``mark`` reads in the same statement (the
    table's change mark, :mod:`jobs.services.table_changes`: one snapshot for both)."""
    # (in a transaction of its own where none is open: the setting lasts as long as it)
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        if not steady:  # (else the caller has just seen to it: :func:`steady_scan_order`)
            steady_scan_order(cursor)
        cursor.execute(f"SELECT {LISTED.format(id_column=id_column)}, {mark} FROM {table} "
                       f"{'WHERE ' + where if where else ''}", params)
        rows, marked = cursor.fetchone()
        return rows or "", marked


# What :func:`listing` selects, for a caller that reads it beside other aggregates of one scan.
LISTED = "string_agg({id_column}::text || ':' || xmin::text, ',')"


def steady_scan_order(cursor) -> None:
    """Have the scans of the next statements of the transaction under way on ``cursor`` list an
    unchanged table in the same order every time. A sequential scan of a table past a quarter of
    shared_buffers starts where another scan of it has got to (``synchronize_seqscans``: one
    running beside it, or one a LIMIT cut short): the same rows then come rotated, which
    ``RowVersions.read`` takes for a change and answers by looking at every row. Set for the
    transaction only: no session state, which a transaction-pooling PgBouncer would hand to
    other clients."""
    cursor.execute("SELECT set_config('synchronize_seqscans', 'off', true)")


# ``fetch(ids)``; ``fetch(None)``: every row the listing's condition matches, in one scan (a first
# read holds none of them: looking 50,000 ids up cost PostgreSQL 120 ms where the scan costs 75).
Fetch = Callable[[list[str] | None], Iterable[tuple[int, str, Any]]]


class RowVersions:
    """What was last read of each row, with the version it was read at. A row whose version did not
    move still holds it. A version written by the reading transaction itself is never kept: that
    transaction may change the row again under the same version.

    ``ordered``: what ``read`` returns is by id, whatever order the listing came in and however
    little of it was read again (a listing sorted by PostgreSQL cost twice an unsorted one).

    A read given the table's change mark read with its listing (:mod:`jobs.services.table_changes`)
    is answered again by :meth:`unchanged` while the mark stays: no listing at all."""

    def __init__(self, ordered: bool = False) -> None:
        self.ordered = ordered
        self._seen: dict[str, tuple[int, Any]] = {}  # "id:version" -> (id, value read at that version)
        self._key_of: dict[int, str] = {}  # id -> its "id:version" in ``_seen``
        self._values: dict[int, Any] = {}
        # Ids in ``_values`` that ``_seen`` does not keep (read at the reading transaction's own
        # version): looked at again by the next read whatever its listing says.
        self._unkept: set[int] = set()
        self._unsorted = False  # ``remember`` added ids at the end of an ordered ``_values``
        # The listing of the last read, while ``_values`` is exactly what it read and all of it is
        # kept: the same text again (one comparison at C speed) is answered without a look at
        # each of 50,000 rows.
        self._last: str | None = None
        # Moves whenever what ``read`` returns may have changed (a caller may key its own
        # derived work on it); never the same for two instances.
        self.generation = self._born = next(_generations)
        # (the generation before the last read, the ids whose value that read changed, added or
        # dropped): what a caller that derived something from the values at that generation needs
        # to redo; None after a read that looked at every row.
        self.delta: tuple[int, set[int]] | None = None
        # The change mark the listing in ``_last`` was read with (None: none to go by).
        self._mark: str | None = None

    @property
    def never_read(self) -> bool:
        """Nothing read or remembered yet: :meth:`read_every` needs no listing."""
        return self.generation == self._born

    def read_every(self, fetch: Fetch) -> dict[int, Any]:
        """A first read: every row ``fetch(None)`` finds, taken as they are, with no listing to
        compare them with (a new process reads 50,000 rows this way; listing them too cost
        PostgreSQL a second scan and this process a look at each of them). The next :meth:`read`
        lists them and finds them all kept."""
        own = own_xid()
        kept: dict[str, tuple[int, Any]] = {}
        key_of: dict[int, str] = {}
        values: dict[int, Any] = {}
        unkept: set[int] = set()
        for row_id, version, value in fetch(None):
            _take(row_id, version, value, own, kept, key_of, values, unkept)
        if self.ordered:
            values = {row_id: values[row_id] for row_id in sorted(values)}
        self._seen, self._key_of, self._values, self._unkept = kept, key_of, values, unkept
        self._unsorted, self.delta, self._last, self._mark = False, None, None, None
        self.generation = next(_generations)
        return values

    def unchanged(self, mark: str | None) -> dict[int, Any] | None:
        """What the last read returned, if ``mark`` (the table's change mark now) is the one its
        listing was read with: nothing was written to the table since, so a listing now would be
        that one again. Else None: list and :meth:`read`."""
        return self._values if mark is not None and mark == self._mark else None

    def read(self, rows: str, fetch: Fetch, mark: str | None = None) -> dict[int, Any]:
        """``rows``: every row wanted now, as :func:`listing` gives them. ``fetch(ids)``: (id,
        version, value) of those rows, version and value read in one statement (``fetch(None)``:
        of every row the listing's condition matches; rows it did not list are left out). Returns id ->
        value (rows gone between the two reads are left out): by id if ``ordered``, else in no
        particular order. ``mark``: the table's change mark read with ``rows``."""
        values = self._read(rows, fetch)
        # (only a read that kept every row it returns can be answered again without a look)
        self._mark = mark if self._last is not None else None
        return values

    def read_changes(self, items: list[str], left: set[int], fetch: Fetch, mark: str | None) -> dict[int, Any] | None:
        """The last read brought up to date with the rows written since it, as a feed of the table's
        writes gives them (:mod:`jobs.services.job_feed`), not with a listing of every row:
        ``items``, ``id:version`` of the rows written since that the listing's condition matches
        now; ``left``, the ids of those written since that it does not. Same answer as
        :meth:`read` given a listing made now. The reading transaction must have written none of
        the table's rows. None where only a listing can tell (nothing read yet)."""
        if self.never_read or self._unsorted or self._unkept:
            return None  # (rows read at the reading transaction's own version: only a listing names them)
        seen, key_of = self._seen, self._key_of
        stale = set(items).difference(seen)
        gone = {key_of[row_id] for row_id in left if row_id in key_of}
        for item in stale:  # (a row at a new version: its old one is gone)
            before = key_of.get(int(item.partition(":")[0]))
            if before is not None:
                gone.add(before)
        if stale or gone:
            self._values = self._patch("", items, stale, gone, fetch, None)
            self._last = None  # (no listing of every row was read)
        self._mark = mark  # (no row is read at the reading transaction's own version: none is unkept)
        return self._values

    def _read(self, rows: str, fetch: Fetch) -> dict[int, Any]:
        if rows == self._last:
            return self._values
        items = rows.split(",") if rows else []
        if self._values and not self._unsorted:
            # The last read's values, with the rows listed at a new version read again and the
            # rows no longer listed dropped: set operations at C speed, then work for the changed
            # rows only (a cycle in which a few of 50,000 jobs moved).
            listed = set(items)
            stale = listed.difference(self._seen)  # new rows, rows at a new version, rows not kept
            gone = self._seen.keys() - listed
            if not stale and not gone and not self._unkept:
                self._last = rows
                return self._values  # every row as last read and kept, and no other
            own = own_xid()
            # (a row listed at this transaction's own version could be one kept from before: only
            # a look at each row tells, so a listing that holds that version is read row by row)
            if own is None or f":{own}," not in rows + ",":
                return self._patch(rows, items, stale, gone, fetch, own)
        else:
            own = own_xid()
        return self._read_all(rows, items, fetch, own)

    def _patch(self, rows: str, items: list[str], stale: set[str], gone: set[str], fetch: Fetch,
               own: str | None) -> dict[int, Any]:
        seen, key_of = self._seen, self._key_of
        stale_ids = {int(item.partition(":")[0]): item for item in stale}
        values = dict(self._values)  # (callers may still hold the last one)
        touched = set(stale_ids)
        for key in gone:
            row_id = seen.pop(key)[0]
            if key_of.get(row_id) == key:
                del key_of[row_id]
            touched.add(row_id)
            if row_id not in stale_ids:
                values.pop(row_id, None)
        for row_id in self._unkept:
            touched.add(row_id)
            if row_id not in stale_ids:
                values.pop(row_id, None)
        self._unkept = set()
        read = ({row_id: (version, value) for row_id, version, value in fetch(list(map(str, stale_ids)))}
                if stale_ids else {})
        added = False
        for row_id in stale_ids:
            fresh = read.get(row_id)
            if fresh is None:
                values.pop(row_id, None)  # gone since the listing
                continue
            version, value = fresh
            added = added or row_id not in values
            values[row_id] = value  # (a row read again keeps its place)
            if version == own:
                self._unkept.add(row_id)
            else:
                key = key_of[row_id] = f"{row_id}:{version}"
                seen[key] = (row_id, value)
        if self.ordered and added:
            # (the kept rows are one sorted run, the added ones a short tail: merged, not sorted anew)
            values = {row_id: values[row_id] for row_id in sorted(values)}
        self.delta = (self.generation, touched)
        self._values = values
        self.generation = next(_generations)
        self._last = rows if not self._unkept and len(values) == len(items) else None
        return values

    def _read_all(self, rows: str, items: list[str], fetch: Fetch, own: str | None) -> dict[int, Any]:
        seen = self._seen
        stale = [item for item in items if item not in seen]
        if not stale and len(items) == len(seen) == len(self._values) and not self._unsorted:
            self._last = rows
            return self._values  # every row as last read and kept, and no other
        read = {}
        if stale:
            ids = [item.partition(":")[0] for item in stale] if seen else None
            read = {row_id: (version, value) for row_id, version, value in fetch(ids)}
        own_suffix = None if own is None else ":" + own
        kept: dict[str, tuple[int, Any]] = {}
        key_of: dict[int, str] = {}
        values: dict[int, Any] = {}
        unkept: set[int] = set()
        for item in items:
            found = seen.get(item)
            if found is None:
                row_id = int(item.partition(":")[0])
                fresh = read.get(row_id)
                if fresh is None:
                    continue  # gone since the listing
                _take(row_id, *fresh, own, kept, key_of, values, unkept)
            else:
                row_id = found[0]
                values[row_id] = found[1]
                if own_suffix is None or not item.endswith(own_suffix):
                    kept[item], key_of[row_id] = found, item
                else:
                    unkept.add(row_id)
        if self.ordered:
            values = {row_id: values[row_id] for row_id in sorted(values)}
        self._seen, self._key_of, self._values, self._unkept = kept, key_of, values, unkept
        self._unsorted, self.delta = False, None
        self.generation = next(_generations)
        self._last = rows if len(kept) == len(values) == len(items) else None
        return values

    def remember(self, written: Iterable[tuple[int, str, Any]]) -> None:
        """Rows this process has just written, as (id, version, value), so that the next read
        need not fetch them back. Call it only once the (sub)transaction that wrote them has ended
        for good, in ``transaction.on_commit``: until then it could change them again under the
        same version. A row that is changed or gone later reads as stale or missing as usual."""
        rows = list(written)
        if not rows:
            return
        self._last = self._mark = self.delta = None  # (the delta tells of a read only)
        self.generation = next(_generations)  # (once for all the rows: thousands a cycle)
        seen, key_of, values, unkept = self._seen, self._key_of, self._values, self._unkept
        for row_id, version, value in rows:
            key = f"{row_id}:{version}"
            before = key_of.get(row_id)
            if before is not None and before != key:
                del seen[before]  # (the row is at its new version now: no read will list the old)
            if self.ordered and row_id not in values:
                self._unsorted = True
            seen[key], key_of[row_id] = (row_id, value), key
            values[row_id] = value
            unkept.discard(row_id)


def _take(row_id: int, version: str, value: Any, own: str | None, kept: dict, key_of: dict, values: dict,
          unkept: set) -> None:
    """A row read at ``version``: its value, kept by version unless the reading transaction wrote
    it (``own``: it may write it again under the same version)."""
    values[row_id] = value
    if version != own:
        key = key_of[row_id] = f"{row_id}:{version}"
        kept[key] = (row_id, value)
    else:
        unkept.add(row_id)
