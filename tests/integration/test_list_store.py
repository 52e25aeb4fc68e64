"""Adding many list entries at once, on both online stores (SQLite and a real redis-server):
one change, idempotent, counted like ``add``. Sweeping expired entries: each audited before
it goes, only the entry read, and a sweep that finds nothing new reads one counter."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from fraud.v1 import events_pb2
from loadtest.brokers import RedisServer
from services.domain.lists import ListEntry, ListKind, ListName
from services.eventlog import audit
from services.featurestore.lists import ListStore, RedisListStore, SqliteListStore
from services.updater.expiry import ListExpiry

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ListStore]:
    if request.param == "sqlite":
        lists: ListStore = SqliteListStore(str(tmp_path / "online.db"))
        yield lists
        lists.close()
        return
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        lists = RedisListStore(redis.Redis(host=server.host, port=server.port))
        yield lists
        lists.close()
    finally:
        server.stop()


def _entries(count: int, reason: str = "bulk") -> list[ListEntry]:
    return [
        ListEntry(ListKind.CARD, f"card-b{i:06d}", ListName.BLOCK, reason, None, 1.0, "ops")
        for i in range(count)
    ]


def test_many_entries_are_one_change_and_adding_them_again_changes_nothing(
    store: ListStore,
) -> None:
    entries = _entries(5_000)
    assert store.add_many(entries) == 5_000
    generation, stored = store.entries()
    assert generation == 1
    assert sorted(e.value for e in stored) == [e.value for e in entries]
    # Again, even from another actor later: nothing changes, the generation stays.
    assert store.add_many([replace(e, actor="other", added_at_s=2.0) for e in entries]) == 0
    assert store.generation() == 1
    # A new reason for some and a new entry: those change, in one more change.
    changed = [replace(e, reason="confirmed") for e in entries[:10]]
    extra = ListEntry(ListKind.MERCHANT, "merch-x", ListName.ALLOW, "partner", None, 1.0, "ops")
    assert store.add_many([*changed, extra]) == 11
    generation, stored = store.entries()
    assert generation == 2 and len(stored) == 5_001
    assert store.add_many([]) == 0
    assert store.generation() == 2


class _Counting:
    """A store that counts its full reads."""

    def __init__(self, store: ListStore) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def entries(self) -> tuple[int, list[ListEntry]]:
        self.reads += 1
        return self.store.entries()


def test_expired_entries_are_audited_then_swept_once(store: ListStore) -> None:
    def entry(value: str, expires_at_s: float | None) -> ListEntry:
        return ListEntry(ListKind.CARD, value, ListName.BLOCK, "fraud", expires_at_s, 1.0, "ops")

    soon, later, never = entry("card-soon", 100.0), entry("card-later", 200.0), entry("c", None)
    assert store.add_many([soon, later, never]) == 3
    written: list[events_pb2.EventEnvelope] = []

    def envelope(e: ListEntry, generation: int) -> events_pb2.EventEnvelope:
        assert e.expires_at_s is not None
        return audit.entry_change("expire", e, generation, e.expires_at_s, "expiry")

    counting = _Counting(store)
    expiry = ListExpiry(counting, written.append, envelope)  # type: ignore[arg-type]
    assert expiry.sweep(50.0) == [] and counting.reads == 1
    # Nothing changed and nothing expired since: one counter read, no full read.
    assert expiry.sweep(60.0) == [] and counting.reads == 1
    assert expiry.sweep(150.0) == [soon]
    assert [(w.list_change.change, w.list_change.value) for w in written] == [
        (events_pb2.LIST_CHANGE_EXPIRE, "card-soon")
    ]
    assert sorted(e.value for e in store.entries()[1]) == ["c", "card-later"]
    # Replaced since it was read (a new expiry): not removed.
    assert store.add(entry("card-later", 300.0))
    assert not store.remove_entry(later)
    assert store.remove_entry(entry("card-later", 300.0))
    assert not store.remove_entry(entry("card-later", 300.0))
    assert expiry.sweep(10_000.0) == [] and [e.value for e in store.entries()[1]] == ["c"]
