"""The monitor's view of the fraud team's rules, from real decision events: each rule's fire
rate, live and in shadow, and its precision as outcomes arrive (before or after their
decision, changed, or after a restart), as gauges and in the report from the decision log."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2
from fraud.v1 import scoring_pb2 as pb
from services.eventlog import Record
from services.monitor import snapshot
from services.monitor.metrics import MonitorMetrics
from services.pipelines import decisions as reader
from services.pipelines import monitoring

from .test_decisionlog import write_flush
from .test_monitor import _engine, _reference, decision, outcome


def _ruled(tid: str, index: int) -> Record:
    """Every third payment declined by live rule ``big``; every other one in shadow rule
    ``watch``'s sights; the rest the model's."""
    record = decision(tid, 0.1 + 0.01 * (index % 50))
    envelope = record.envelope()
    d = envelope.decision
    if index % 3 == 0:
        d.scored_by = pb.SCORED_BY_RULES
        d.model_version = "policy-3"
        d.decision = pb.DECISION_DECLINE
        d.score = 1.0
        d.reasons[:] = ["rule big: decline by rule big"]
    if index % 2 == 0:
        d.shadow_rules.append("watch=review")
    return Record(record.key, envelope.SerializeToString(), "0")


def _traffic(n: int = 60) -> tuple[list[Record], dict[str, bool]]:
    decisions = [_ruled(f"r{i}", i) for i in range(n)]
    labels = {f"r{i}": i % 5 == 0 for i in range(0, n, 2)}
    return decisions, labels


def _expected(labels: dict[str, bool], n: int) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(fires, frauds, goods) per rule, computed from how the traffic was made."""
    fired = {("big", "live"): [i for i in range(n) if i % 3 == 0],
             ("watch", "shadow"): [i for i in range(n) if i % 2 == 0]}  # fmt: skip
    return {
        rule: (
            len(ids),
            sum(1 for i in ids if labels.get(f"r{i}") is True),
            sum(1 for i in ids if labels.get(f"r{i}") is False),
        )
        for rule, ids in fired.items()
    }


def test_fire_rates_and_precision_across_outcomes_and_a_restart(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ref = _reference(rng)
    n = 60
    decisions, labels = _traffic(n)
    now = time.time()
    items = list(labels.items())
    engine = _engine(tmp_path / "state.db", ref)
    # A third of the outcomes arrive before their decisions, a third after, a third after a
    # restart; one changes its mind after the restart.
    engine.apply([outcome(t, f, now - 10) for t, f in items[:10]])
    engine.apply(decisions)
    engine.apply([outcome(t, f, now - 10) for t, f in items[10:20]])
    engine.apply([outcome(items[20][0], not items[20][1], now - 20)])
    engine.checkpoint()
    engine = _engine(tmp_path / "state.db", ref)
    engine.apply([outcome(t, f, now - 5) for t, f in items[20:]])
    views = {(v.name, v.mode): v for v in engine.rule_views()}
    for rule, (fires, frauds, goods) in _expected(labels, n).items():
        view = views[rule]
        assert (view.fires, view.frauds, view.goods) == (fires, frauds, goods), rule
        assert view.fire_ratio == fires / n
        assert view.precision == frauds / (frauds + goods)
    assert views[("big", "live")].action == "decline"
    assert views[("watch", "shadow")].action == "review"
    # Applied again (the log redelivers after a crash), nothing is counted twice.
    engine.apply(decisions)
    assert {(v.name, v.mode): v.fires for v in engine.rule_views()} == {
        rule: view.fires for rule, view in views.items()
    }

    registry = CollectorRegistry()
    MonitorMetrics(registry).publish(snapshot.take(engine), set())
    labels_of = {"rule": "watch", "mode": "shadow", "action": "review"}
    assert registry.get_sample_value("fraudmesh_rule_fire_ratio", labels_of) == 0.5
    expected = views[("watch", "shadow")].precision
    assert registry.get_sample_value("fraudmesh_rule_precision", labels_of) == expected


def test_the_report_counts_the_rules_as_the_monitor_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    n = 60
    decisions, labels = _traffic(n)
    now = time.time()
    outcomes = [outcome(t, f, now - 5) for t, f in labels.items()]
    engine = _engine(tmp_path / "state.db", _reference(rng))
    engine.apply(decisions + outcomes)
    envelopes = [events_pb2.EventEnvelope.FromString(r.value) for r in decisions + outcomes]
    write_flush(tmp_path / "log", 1, envelopes)
    table, _ = reader.joined(tmp_path / "log")
    report = monitoring.rule_figures(table.to_pandas())
    monitor = {(v.name, v.mode): v for v in engine.rule_views()}
    assert len(report) == len(monitor) == 2
    for row in report:
        view = monitor[(row["name"], row["mode"])]
        assert (row["fires"], row["frauds"], row["goods"]) == (view.fires, view.frauds, view.goods)
        assert math.isclose(row["precision"], view.precision)
