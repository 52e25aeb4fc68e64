"""Every change to the fraud team's lists is audited on the event log: ``fraudmesh lists add``
and ``remove`` each write one ``ListChangeEvent`` (an add that changes nothing writes none),
and the log's consumers (decision sink, monitor) skip it as an event they do not keep."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from fraud.v1 import events_pb2
from services.cli.main import app
from services.decisionlog.rows import AddResult, Batch, RecentIds
from services.eventlog import EventLogSettings, Record, open_consumer

from .test_monitor import _engine, _reference

runner = CliRunner()


def _changes(var_dir: Path) -> list[tuple[Record, events_pb2.ListChangeEvent]]:
    settings = EventLogSettings(var_dir=var_dir, groups=())
    found = []
    with open_consumer(settings, f"audit-{uuid.uuid4().hex[:8]}") as consumer:
        while records := consumer.poll(100, 0.2):
            for record in records:
                envelope = record.envelope()
                assert envelope.WhichOneof("event") == "list_change"
                found.append((record, envelope.list_change))
    return found


def test_each_change_is_one_audit_record(tmp_path: Path) -> None:
    def lists(*args: str) -> None:
        result = runner.invoke(app, ["lists", *args, "--var-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output

    lists("add", "card", "card-7", "--reason", "stolen")
    lists("add", "card", "card-7", "--reason", "stolen")
    lists("add", "card", "card-7", "--reason", "stolen", "--expires-in-s", "600")
    lists("remove", "card", "card-7")
    assert (
        runner.invoke(
            app, ["lists", "remove", "card", "card-7", "--var-dir", str(tmp_path)]
        ).exit_code
        == 1
    )
    changes = _changes(tmp_path)
    # The second add changed nothing; the third changed the expiry; the failed remove, nothing.
    kinds = [c.change for _, c in changes]
    assert kinds == [
        events_pb2.LIST_CHANGE_ADD,
        events_pb2.LIST_CHANGE_ADD,
        events_pb2.LIST_CHANGE_REMOVE,
    ]
    first, replaced, removed = (c for _, c in changes)
    assert (first.list, first.kind, first.value, first.reason) == (
        "block",
        "card",
        "card-7",
        "stolen",
    )
    assert replaced.HasField("expires_at") and not first.HasField("expires_at")
    assert first.actor and first.changed_at.seconds > 0
    assert first.generation < replaced.generation < removed.generation
    assert len({c.event_id for _, c in changes}) == 3
    assert {r.key for r, _ in changes} == {b"list:card:card-7"}
    # Consumers of decisions and outcomes pass over it.
    batch = Batch(RecentIds(10))
    assert {batch.add(r) for r, _ in changes} == {AddResult.OTHER}
    engine = _engine(tmp_path / "monitor.db", _reference(np.random.default_rng(1)))
    stats = engine.apply([r for r, _ in changes])
    assert (stats.invalid, stats.decisions, stats.outcomes) == (0, 0, 0)
