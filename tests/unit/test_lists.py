"""The fraud team's lists: entry checks, matching (block before allow, prefixes, expiry), the
SQLite store (idempotent add, generation), the gateway's control and follower, and the
``fraudmesh lists`` command."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from services.cli.main import app
from services.common.errors import InvalidArgument
from services.domain.lists import ListEntry, ListIndex, ListKind, ListName, check_entry
from services.featurestore.lists import SqliteListStore, open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.budget import Budget
from services.gateway.controls import ListControl, ListFollower
from services.gateway.pipeline import Decision, ScoredBy

from .test_pipeline import POLICY, TX, Features, Model, _pipeline, _store

NOW = 1_800_000_000.0


def _entry(
    kind: ListKind,
    value: str,
    name: ListName = ListName.BLOCK,
    expires: float | None = None,
    reason: str = "confirmed fraud",
) -> ListEntry:
    return ListEntry(kind, value, name, reason, expires, NOW - 10, "analyst@host")


@pytest.mark.parametrize(
    ("kind", "value", "reason", "expires", "field"),
    [
        (ListKind.CARD, "", "r", None, "value"),
        (ListKind.CARD, "x" * 500, "r", None, "value"),
        (ListKind.CARD_PREFIX, "41", "r", None, "value"),
        (ListKind.CARD_PREFIX, "4111111111111", "r", None, "value"),
        (ListKind.MERCHANT, "m", " ", None, "reason"),
        (ListKind.MERCHANT, "m", "r" * 201, None, "reason"),
        (ListKind.MERCHANT, "m", "line\nbreak", None, "reason"),
        (ListKind.TERMINAL, "t", "r", NOW - 1, "expires"),
        (ListKind.TERMINAL, "t", "r", float("nan"), "expires"),
    ],
)
def test_a_wrong_entry_names_the_field(
    kind: ListKind, value: str, reason: str, expires: float | None, field: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_entry(kind, value, reason, expires, NOW)
    assert raised.value.field == field


def test_matching_by_each_kind_block_before_allow_and_expiry() -> None:
    index = ListIndex(
        [
            _entry(ListKind.CARD, "card-1"),
            _entry(ListKind.CARD_PREFIX, "411111"),
            _entry(ListKind.MERCHANT, "merch-9", ListName.ALLOW),
            _entry(ListKind.TERMINAL, "term-3"),
            _entry(ListKind.CARD, "card-old", expires=NOW - 1),
        ],
        generation=7,
    )
    assert index.size == 5
    found = index.match("card-1", "m", "", NOW)
    assert found is not None and found.value == "card-1"
    found = index.match("4111119999", "m", "", NOW)
    assert found is not None and found.kind is ListKind.CARD_PREFIX
    assert index.match("411", "m", "", NOW) is None
    found = index.match("c", "m", "term-3", NOW)
    assert found is not None and found.kind is ListKind.TERMINAL
    # A blocked card at an allowed merchant is declined: block wins.
    found = index.match("card-1", "merch-9", "", NOW)
    assert found is not None and found.list is ListName.BLOCK
    found = index.match("c", "merch-9", "", NOW)
    assert found is not None and found.list is ListName.ALLOW
    # Expired: no match; an empty terminal never matches.
    assert index.match("card-old", "m", "", NOW) is None
    assert index.match("c", "m", "", NOW) is None
    assert ListIndex([]).match("card-1", "m", "", NOW) is None


def test_the_sqlite_store_adds_idempotently_and_counts_changes(tmp_path: Path) -> None:
    store = SqliteListStore(str(tmp_path / "online.db"))
    assert store.entries() == (0, [])
    entry = _entry(ListKind.CARD, "card-1")
    assert store.add(entry)
    assert not store.add(entry)
    # Another actor adding the same entry later changes nothing either.
    assert not store.add(replace(entry, added_at_s=NOW, actor="other@host"))
    generation, entries = store.entries()
    assert (generation, entries) == (1, [entry])
    assert store.add(_entry(ListKind.CARD, "card-1", reason="now a new reason"))
    assert store.generation() == 2
    assert store.remove(ListName.BLOCK, ListKind.CARD, "card-1")
    assert not store.remove(ListName.BLOCK, ListKind.CARD, "card-1")
    assert store.entries() == (3, [])
    store.close()


def test_a_reader_creates_nothing(tmp_path: Path) -> None:
    settings = FeatureStoreSettings(var_dir=tmp_path)
    assert open_lists(settings, reader=True) is None
    assert not settings.online_file.exists()
    settings.online_file.parent.mkdir(parents=True)
    settings.online_file.touch()
    reader = open_lists(settings, reader=True)
    assert reader is not None and reader.entries() == (0, [])
    writer = open_lists(settings)
    assert writer is not None and writer.add(_entry(ListKind.CARD, "card-1"))
    assert reader.entries()[0] == 1
    reader.close()
    writer.close()


async def test_a_blocked_card_is_declined_before_the_model_and_named() -> None:
    model = Model(0.05)
    pipeline = _pipeline(Features(_store()), model)
    control = ListControl(ListIndex([_entry(ListKind.CARD, TX.card_id)], 4), clock=lambda: NOW)
    pipeline.controls = (control,)
    result = await pipeline.score(TX, Budget(POLICY, None))
    assert result.decision is Decision.DECLINE and result.scored_by is ScoredBy.RULES
    assert result.model_version == "lists-4"
    assert result.reasons[0] == f"block list: card {TX.card_id}: confirmed fraud"
    assert model.calls == 0
    control.index = ListIndex([_entry(ListKind.MERCHANT, TX.merchant_id, ListName.ALLOW)], 5)
    result = await pipeline.score(TX, Budget(POLICY, None))
    assert result.decision is Decision.APPROVE and result.model_version == "lists-5"
    # Expired: the model answers again, with no read of the store.
    control.index = ListIndex([_entry(ListKind.CARD, TX.card_id, expires=NOW)], 6)
    result = await pipeline.score(TX, Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and model.calls == 1


async def test_the_follower_reads_again_only_when_the_generation_moves(tmp_path: Path) -> None:
    store = SqliteListStore(str(tmp_path / "online.db"))
    control = ListControl(clock=lambda: NOW)
    follower = ListFollower(store, control, poll_s=0.01)
    follower.load()
    assert control.index is not None and control.index.size == 0
    store.add(_entry(ListKind.CARD, "card-1"))
    await follower.check()
    assert control.index.generation == 1 and control.index.size == 1
    kept = control.index
    await follower.check()
    assert control.index is kept
    store.remove(ListName.BLOCK, ListKind.CARD, "card-1")
    await follower.check()
    assert control.index.size == 0
    store.close()


runner = CliRunner()


def test_the_lists_command(tmp_path: Path) -> None:
    def lists(*args: str) -> Result:
        return runner.invoke(
            app, ["lists", *args, "--var-dir", str(tmp_path)], env={"COLUMNS": "200"}
        )

    added = lists("add", "card", "card-7", "--reason", "stolen")
    assert added.exit_code == 0 and "added card card-7 on the block list" in added.output
    again = lists("add", "card", "card-7", "--reason", "stolen")
    assert again.exit_code == 0 and "unchanged" in again.output
    allowed = lists(
        "add", "merchant", "m-1", "--list", "allow", "--reason", "vip", "--expires-in-s", "60"
    )
    assert allowed.exit_code == 0
    shown = lists("show")
    assert "2 entries (generation 2)" in shown.output
    assert "stolen" in shown.output and "vip" in shown.output
    bad = lists("add", "card_prefix", "41", "--reason", "bin")
    assert bad.exit_code == 2 and "value: a card prefix" in bad.output
    assert lists("remove", "card", "card-7").exit_code == 0
    missing = lists("remove", "card", "card-7")
    assert missing.exit_code == 1 and "not on the block list" in missing.output


class _Flaky:
    """A list store that fails until told to answer (a Redis that is down, then up)."""

    def __init__(self) -> None:
        self.down = True
        self.entries_read = 0

    def generation(self) -> int:
        if self.down:
            raise OSError("connection refused")
        return 1

    def entries(self) -> tuple[int, list[ListEntry]]:
        self.entries_read += 1
        return self.generation(), [_entry(ListKind.CARD, "card-1")]

    def add(self, entry: ListEntry) -> bool:
        raise NotImplementedError

    def remove(self, name: ListName, kind: ListKind, value: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass


async def test_a_store_down_at_start_is_read_once_it_answers() -> None:
    store = _Flaky()
    control = ListControl(clock=lambda: NOW)
    follower = ListFollower(store, control, poll_s=0.01)
    with pytest.raises(OSError):
        follower.load()
    assert control.index is None
    with pytest.raises(OSError):
        await follower.check()
    store.down = False
    await follower.check()
    assert control.index is not None and control.index.size == 1
    await follower.check()
    assert store.entries_read == 2  # the failed read at start, then one once it answered
