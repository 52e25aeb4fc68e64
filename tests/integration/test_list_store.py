"""Adding many list entries at once, on both online stores (SQLite and a real redis-server):
one change, idempotent, counted like ``add``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from loadtest.brokers import RedisServer
from services.domain.lists import ListEntry, ListKind, ListName
from services.featurestore.lists import ListStore, RedisListStore, SqliteListStore

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
