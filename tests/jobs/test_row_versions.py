"""Rows kept by their version: whatever happened to the table between two reads, a read gives
what a first read of the same listing gives, and fetches only rows it does not hold at their
listed version."""

import random

import pytest

from jobs.services import row_versions
from jobs.services.row_versions import RowVersions


class Table:
    """A table as ``listing`` and a fetch see it: id -> (version, value)."""

    def __init__(self, rng: random.Random):
        self.rng, self.rows, self.versions, self.fetched = rng, {}, iter(range(100, 10**9)), []
        self.vanishing: set[int] = set()  # gone between the listing and the fetch
        # Written by the reading transaction (at this version) between the listing and its fetch.
        self.racing: dict[int, str] = {}
        self.raced: set[int] = set()  # (rows written so, which this transaction writes again most)

    def write(self, row_id: int, version: int | None = None) -> tuple[int, str, str]:
        """(a transaction may write a row twice under its one version: each write a new value)"""
        version = str(version if version is not None else next(self.versions))
        self.rows[row_id] = (version, f"value {row_id}, write {next(self.versions)}")
        return row_id, version, self.rows[row_id][1]

    def listing(self) -> str:
        """(in scan order: any order, another each time)"""
        ids = self.rng.sample(sorted(self.rows), len(self.rows))
        return ",".join(f"{row_id}:{self.rows[row_id][0]}" for row_id in ids)

    def fetch(self, ids: list[str] | None):
        if ids is None:  # (every row there is now, listed or not)
            ids = [str(row_id) for row_id in self.rows]
        self.fetched.extend(map(int, ids))
        for row_id, version in self.racing.items():
            if str(row_id) in ids:
                self.write(row_id, int(version))
                self.raced.add(row_id)
        self.racing = {}
        for row_id in map(int, ids):
            if row_id in self.rows and row_id not in self.vanishing:
                yield row_id, *self.rows[row_id]


@pytest.mark.parametrize("first", ["listed", "every row"])
@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_a_read_after_any_history_is_what_a_first_read_gives(monkeypatch, seed, ordered, first):
    rng = random.Random(seed)
    own = {"xid": None}
    monkeypatch.setattr(row_versions, "own_xid", lambda: own["xid"])
    table = Table(rng)
    for row_id in rng.sample(range(1, 60), 30):
        table.write(row_id)
    kept = RowVersions(ordered)
    if first == "every row":  # (a new process's first read, with no listing; a row maybe its own write)
        own["xid"] = str(table.write(rng.choice(sorted(table.rows)))[1]) if seed % 2 else None
        assert kept.never_read
        got = kept.read_every(table.fetch)
        assert got == {row_id: value for row_id, (_, value) in table.rows.items()} and not kept.never_read
        if ordered:
            assert list(got) == sorted(got)
    for _ in range(60):
        table.vanishing = set()
        for _ in range(rng.choice([0, 0, 1, 2, 5])):
            step, ids = rng.randrange(8), sorted(table.rows)
            if step == 0 or not ids:
                table.write(rng.randrange(1, 80))  # a new row (or a row written again), any id
            elif step == 1:
                table.write(rng.choice(ids))
            elif step == 2:  # (now and then one read at this or an earlier transaction's own version)
                del table.rows[rng.choice(sorted(kept._unkept & set(ids)) or ids)]
            elif step == 3:  # this transaction writes a row (again): its version is the transaction's own
                own["xid"] = own["xid"] or str(next(table.versions))
                table.write(rng.choice(sorted(table.raced & set(ids)) or ids), int(own["xid"]))
            elif step == 4:  # a new transaction
                own["xid"], table.raced = None, set()
            elif step == 5:  # a committed write of this process, remembered instead of read back
                own["xid"], table.raced = None, set()
                kept.remember([table.write(rng.choice([*ids, rng.randrange(1, 80)]))])
            elif step == 6:
                table.vanishing.add(rng.choice(ids))
            else:  # someone writes a row, then this transaction too, between the listing and the fetch
                own["xid"] = own["xid"] or str(next(table.versions))
                table.racing[table.write(rng.choice(ids))[0]] = own["xid"]
        listing = table.listing()
        held_before = set(kept._seen)
        table.fetched = []
        got = kept.read(listing, table.fetch)
        fetched = list(table.fetched)
        # (a row gone between the listing and the fetch is left out if it had to be fetched)
        table.vanishing &= set(fetched)
        table.racing = {}
        expected = RowVersions(ordered).read(listing, table.fetch)
        assert got == expected
        if ordered:
            assert list(got) == list(expected) == sorted(got)
        # Only rows not held at their listed version were fetched.
        listed = dict(item.split(":") for item in listing.split(",")) if listing else {}
        assert not [row_id for row_id in fetched if f"{row_id}:{listed[str(row_id)]}" in held_before]


def test_a_read_of_an_unchanged_listing_fetches_nothing_and_keeps_its_generation(monkeypatch):
    monkeypatch.setattr(row_versions, "own_xid", lambda: None)
    table = Table(random.Random(1))
    for row_id in range(1, 6):
        table.write(row_id)
    kept = RowVersions(ordered=True)
    kept.read(table.listing(), table.fetch)
    generation, table.fetched = kept.generation, []
    assert kept.read(table.listing(), table.fetch) and table.fetched == [] and kept.generation == generation
    table.write(3)
    table.write(0)
    del table.rows[5]
    values = kept.read(table.listing(), table.fetch)
    assert sorted(table.fetched) == [0, 3] and list(values) == [0, 1, 2, 3, 4]
    assert kept.delta == (generation, {0, 3, 5})


def test_a_read_after_a_first_read_of_every_row_fetches_nothing_while_nothing_changed(monkeypatch):
    monkeypatch.setattr(row_versions, "own_xid", lambda: None)
    table = Table(random.Random(2))
    for row_id in range(1, 6):
        table.write(row_id)
    kept = RowVersions(ordered=True)
    first = kept.read_every(table.fetch)
    table.fetched = []
    assert kept.read(table.listing(), table.fetch) == first and table.fetched == []
    table.write(2)
    assert kept.read(table.listing(), table.fetch) == {**first, 2: table.rows[2][1]} and table.fetched == [2]


def test_a_row_the_reading_transaction_wrote_is_not_kept_by_a_first_read_of_every_row(monkeypatch):
    own = {"xid": None}
    monkeypatch.setattr(row_versions, "own_xid", lambda: own["xid"])
    table = Table(random.Random(3))
    for row_id in range(1, 4):
        table.write(row_id)
    own["xid"] = table.write(2)[1]  # (written by the reading transaction)
    kept = RowVersions(ordered=True)
    kept.read_every(table.fetch)
    table.write(2, int(own["xid"]))  # written again, under the same version
    assert kept.read(table.listing(), table.fetch)[2] == table.rows[2][1]
