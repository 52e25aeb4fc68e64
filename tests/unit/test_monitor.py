"""The monitor's pure parts: tallies against the metrics computed from the raw values, the
engine's counting (duplicates, outcomes before and after their decision, the latest outcome,
a restart from the state file without double counting), live figures against the field's
metrics on the labelled decisions, and the retraining advice."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fraud.v1 import events_pb2, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from services.domain import featurespec, metrics
from services.eventlog import Record
from services.eventlog.events import feature_schema_id
from services.models import reference as references
from services.models.repository import Thresholds
from services.monitor import evaluation, snapshot, tally
from services.monitor.advice import AdvicePolicy, Advisor, read
from services.monitor.engine import MonitorEngine, MonitorPolicy
from services.monitor.references import Known
from services.monitor.state import Decided, MonitorStore
from services.monitor.tally import Layout

THRESHOLDS = Thresholds(review=0.3, decline=0.7)
NAMES = featurespec.MODEL_FEATURES


def _reference(rng: np.random.Generator, n: int = 5000) -> references.ModelReference:
    scores = rng.beta(0.5, 6.0, n)
    x = rng.gamma(2.0, 10.0, (n, len(NAMES)))
    x[:, NAMES.index("merchant_category")] = rng.choice([5411.0, 5812.0, 5999.0], n)
    x[rng.random((n, len(NAMES))) < 0.05] = np.nan
    return references.fit(scores, x, NAMES, THRESHOLDS, ("2026-01-01", "2026-01-08"))


@dataclass
class Book:
    """A reference book of one version with a reference and no others."""

    known: dict[str, Known]
    orders: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def get(self, version: str) -> Known:
        return self.known.get(version, Known(None, Layout.of(None)))


class _Metadata:
    thresholds = THRESHOLDS


def _book(ref: references.ModelReference) -> Book:
    return Book({"7": Known(_Metadata(), Layout.of(ref)), "8": Known(_Metadata(), Layout.of(ref))})  # type: ignore[arg-type]


def decision(
    tid: str,
    score: float,
    features: list[float] | None = None,
    missing: list[int] | None = None,
    version: str = "7",
    route: int = events_pb2.ROUTE_LIVE,
    decided_s: float | None = None,
    shadow: tuple[str, float] | None = None,
) -> Record:
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = uuid.uuid4().hex
    d.transaction_id = tid
    d.card_id = "card-1"
    d.score = score
    d.decision = (
        pb.DECISION_DECLINE
        if score >= THRESHOLDS.decline
        else pb.DECISION_REVIEW
        if score >= THRESHOLDS.review
        else pb.DECISION_APPROVE
    )
    d.scored_by = pb.SCORED_BY_MODEL
    d.feature_source = pb.FEATURE_SOURCE_ONLINE
    d.model_version = version
    d.route = route
    d.elapsed_ms = 4.0
    if features is not None:
        d.features.extend(features)
        d.feature_schema = feature_schema_id(NAMES)
    d.missing_features.extend(missing or [])
    if shadow is not None:
        d.shadow_model_version, d.shadow_score = shadow
    d.decided_at.FromNanoseconds(int((decided_s or time.time()) * 1e9))
    return Record(b"card-1", envelope.SerializeToString(), "0")


def outcome(tid: str, fraud: bool | None, reported_s: float) -> Record:
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.event_id = uuid.uuid4().hex
    o.transaction_id = tid
    o.outcome = (
        outcomes_pb2.OUTCOME_DISPUTED
        if fraud is None
        else outcomes_pb2.OUTCOME_FRAUD
        if fraud
        else outcomes_pb2.OUTCOME_LEGITIMATE
    )
    o.reported_at.FromNanoseconds(int(reported_s * 1e9))
    o.received_at.FromNanoseconds(int(reported_s * 1e9))
    return Record(tid.encode(), envelope.SerializeToString(), "0")


def test_reference_round_trips_and_fits_the_missing_share(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    ref = _reference(rng)
    ref.write(tmp_path)
    again = references.load(tmp_path)
    assert again == ref
    assert references.load(tmp_path / "none") is None
    assert abs(ref.missing_share("amount_eur") - 0.05) < 0.01
    assert isinstance(ref.features["merchant_category"], metrics.CategoricalReference)
    assert math.isclose(sum(ref.decision_rates.values()), 1.0)
    (tmp_path / references.REFERENCE_FILE).write_text('{"format": 99}')
    with pytest.raises(references.ReferenceFormatError, match="newer"):
        references.load(tmp_path)


def test_tested_quality_is_the_operating_points_with_intervals() -> None:
    rng = np.random.default_rng(2)
    y = rng.random(4000) < 0.05
    s = np.clip(rng.normal(0.2 + 0.5 * y, 0.2), 0, 1)
    quality = references.tested_quality(y, s, THRESHOLDS, rng.integers(0, 500, 4000))
    point = metrics.operating_point(y, s, THRESHOLDS.review)
    assert quality.precision["review"].estimate == point.precision
    assert quality.recall["review"].estimate == point.recall
    low, high = quality.recall["review"].low, quality.recall["review"].high
    assert low < point.recall < high
    assert quality.average_precision.estimate == metrics.average_precision(y, s)


def test_tally_psi_equals_the_reference_psi_of_the_raw_values() -> None:
    rng = np.random.default_rng(3)
    ref = _reference(rng)
    layout = Layout.of(ref)
    n = 3000
    scores = rng.beta(0.5, 4.0, n)
    x = rng.gamma(2.5, 10.0, (n, len(NAMES)))
    x[:, NAMES.index("merchant_category")] = rng.choice([5411.0, 5812.0, 7011.0], n)
    x[rng.random((n, len(NAMES))) < 0.2] = np.nan
    into = layout.empty()
    half = n // 2
    for rows in (slice(0, half), slice(half, n)):
        batch = tally.Scored(
            scores=scores[rows],
            decisions=np.zeros(len(scores[rows]), int),
            rules=np.zeros(len(scores[rows]), bool),
            sources=np.zeros(len(scores[rows]), int),
            latency_ms=np.full(len(scores[rows]), 3.0),
            features=x[rows],
        )
        tally.count(layout, batch, into)
    into = tally.Tally.decode(into.encode())
    drift = tally.drift(layout, into, min_decisions=100)
    assert drift.score_psi == pytest.approx(ref.score.psi(scores), rel=1e-12)
    for j, name in enumerate(NAMES):
        column = x[:, j]
        want = (
            ref.features[name].psi(references.category_codes(column))
            if name in references.CATEGORICAL_FEATURES
            else ref.features[name].psi(column)
        )
        assert drift.feature_psi[name] == pytest.approx(want, rel=1e-12), name
        assert drift.missing_ratio[name] == np.isnan(column).mean()
    assert drift.feature_psi["amount_eur"] > 0.0
    assert math.isnan(tally.drift(layout, into, min_decisions=n + 1).score_psi)
    assert tally.latency_quantile(into, 0.99) == 3.0


def test_grid_psi_compares_arms_on_quantile_bins() -> None:
    rng = np.random.default_rng(4)
    a, b, c = Layout.of(None).empty(), Layout.of(None).empty(), Layout.of(None).empty()
    for t, scores in (
        (a, rng.beta(1, 9, 5000)),
        (b, rng.beta(1, 9, 5000)),
        (c, rng.beta(3, 5, 5000)),
    ):
        t.score_grid += np.bincount(tally.grid_bins(scores), minlength=tally.GRID_BINS)
    assert tally.grid_psi(a, b) < 0.02
    assert tally.grid_psi(a, c) > 0.5


def test_grid_average_precision_is_close_to_the_exact_one() -> None:
    rng = np.random.default_rng(5)
    y = rng.random(20000) < 0.02
    s = np.clip(rng.beta(1 + 4 * y, 12), 1e-6, 1 - 1e-6)
    bins = tally.grid_bins(s)
    ap = evaluation.grid_average_precision(
        np.bincount(bins[y], minlength=tally.GRID_BINS),
        np.bincount(bins[~y], minlength=tally.GRID_BINS),
    )
    assert ap == pytest.approx(metrics.average_precision(y, s), abs=0.01)


def _engine(path: Path, ref: references.ModelReference, **policy: float) -> MonitorEngine:
    return MonitorEngine(MonitorStore(path), _book(ref), MonitorPolicy(**policy))  # type: ignore[arg-type]


def test_engine_counts_each_transaction_once_across_a_restart(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    ref = _reference(rng)
    engine = _engine(tmp_path / "state.db", ref, min_decisions=10)
    vectors = rng.gamma(2.0, 10.0, (200, len(NAMES))).astype(np.float32)
    records = [
        decision(f"t{i}", float(rng.random()), vectors[i].tolist(), [0, 5]) for i in range(200)
    ]
    stats = engine.apply(records[:150] + records[:10])
    assert (stats.decisions, stats.duplicates) == (150, 10)
    engine.checkpoint()
    engine.apply(records[150:])
    # Crash before the second checkpoint: the log gives everything after the first again.
    engine.store.close()
    engine = _engine(tmp_path / "state.db", ref, min_decisions=10)
    stats = engine.apply(records[140:])
    assert (stats.decisions, stats.duplicates) == (50, 10)
    window = engine.window("7")
    assert window.decisions == 200
    assert window.with_features == 200
    assert window.missing[0] == 200 and window.missing[1] == 0
    engine.checkpoint()
    engine.store.close()
    engine = _engine(tmp_path / "state.db", ref, min_decisions=10)
    assert engine.window("7").decisions == 200
    assert engine.evaluation("7")["immature"].decisions == 200


def test_live_figures_equal_the_metrics_of_the_labelled_decisions(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    ref = _reference(rng)
    engine = _engine(tmp_path / "state.db", ref)
    n = 600
    scores = rng.random(n)
    fraud = rng.random(n) < 0.3
    now = time.time()
    tids = [f"tx-{i}" for i in range(n)]
    # A third of the outcomes come before their decisions; some are disputed; some
    # transactions get a second, later outcome that replaces the first.
    early = [outcome(t, bool(f), now - 50) for t, f in zip(tids[:200], fraud[:200], strict=True)]
    engine.apply(early)
    engine.checkpoint()
    engine.apply([decision(t, float(s)) for t, s in zip(tids, scores, strict=True)])
    late = [
        outcome(t, bool(f), now - 40) for t, f in zip(tids[200:400], fraud[200:400], strict=True)
    ]
    disputed = [outcome(t, None, now - 30) for t in tids[400:420]]
    flipped = [outcome(t, not f, now - 20) for t, f in zip(tids[:30], fraud[:30], strict=True)]
    stale = [outcome(t, bool(f), now - 60) for t, f in zip(tids[30:60], ~fraud[30:60], strict=True)]
    engine.apply(late + disputed + flipped + stale)
    truth = fraud.copy()
    truth[:30] = ~truth[:30]
    labelled = np.zeros(n, bool)
    labelled[:400] = True
    figures = engine.evaluation("7")["immature"]
    y, s = truth[labelled], scores[labelled]
    for name, threshold in (("review", THRESHOLDS.review), ("decline", THRESHOLDS.decline)):
        point = metrics.operating_point(y, s, threshold)
        assert figures.precision[name].estimate == pytest.approx(point.precision, abs=1e-12)
        assert figures.recall[name].estimate == pytest.approx(point.recall, abs=1e-12)
    assert figures.labelled == 400 and figures.frauds == int(y.sum())
    assert figures.labelled_ratio == 400 / n
    assert figures.average_precision == pytest.approx(metrics.average_precision(y, s), abs=0.02)
    # Past the label delay, every decision without an outcome is genuine.
    matured = engine.evaluation("7", now + 8 * 86_400 + 7200)["matured"]
    y_all = truth.copy()
    y_all[400:] = False
    keep = np.ones(n, bool)
    keep[400:420] = False
    point = metrics.operating_point(y_all[keep], scores[keep], THRESHOLDS.review)
    assert matured.precision["review"].estimate == pytest.approx(point.precision, abs=1e-12)
    assert matured.labelled == n - 20


def test_shadow_scores_count_in_the_shadow_arm_with_agreement(tmp_path: Path) -> None:
    ref = _reference(np.random.default_rng(8))
    engine = _engine(tmp_path / "state.db", ref)
    engine.apply([decision(f"s{i}", 0.1, shadow=("8", 0.5)) for i in range(20)])
    shadow = engine.window("8", ("shadow",))
    assert shadow.decisions == 20
    assert shadow.agreement[0, 1] == 20  # live approved, the shadow would review
    assert engine.window("8").decisions == 0
    view = snapshot.take(engine)
    assert view.versions["8"].window_decisions["shadow"] == 20


def test_advice_needs_sustained_drift_and_respects_the_cooldown(tmp_path: Path) -> None:
    ref = _reference(np.random.default_rng(9))
    engine = _engine(tmp_path / "state.db", ref, min_decisions=50)
    engine.apply([decision(f"d{i}", 0.95) for i in range(100)])
    advisor = Advisor(tmp_path / "advice.jsonl", AdvicePolicy(sustain_s=60, cooldown_s=3600))
    now = time.time()
    first = snapshot.take(engine, now)
    assert first.versions["7"].drift.score_psi > 0.2
    assert advisor.observe(first) == []
    assert advisor.active == {"7"}
    later = snapshot.Snapshot(now + 61, first.versions)
    entries = advisor.observe(later)
    assert [e["reason"] for e in entries] == ["score_drift"]
    assert advisor.observe(snapshot.Snapshot(now + 120, first.versions)) == []
    assert [e["reason"] for e in read(tmp_path / "advice.jsonl")] == ["score_drift"]
    again = Advisor(tmp_path / "advice.jsonl", AdvicePolicy(sustain_s=0, cooldown_s=3600))
    assert again.observe(snapshot.Snapshot(now + 200, first.versions)) == []


def test_windows_sum_any_range_and_see_late_events(tmp_path: Path) -> None:
    ref = _reference(np.random.default_rng(10))
    engine = _engine(tmp_path / "state.db", ref)
    now = time.time()
    hours_ago = (3.5, 2.5, 1.5, 0.01)
    for i, h in enumerate(hours_ago):
        engine.apply([decision(f"w{i}-{j}", 0.1, decided_s=now - h * 3600) for j in range(10 + i)])
    assert engine.window("7").decisions == 10 + 11 + 12 + 13
    assert engine.window("7", since_s=now - 3 * 3600).decisions == 11 + 12 + 13
    assert engine.window("7", since_s=now - 3 * 3600, until_s=now - 3600).decisions == 11 + 12
    # A late event in a past hour (already summed once) counts in the next window.
    engine.apply([decision("late", 0.9, decided_s=now - 2.5 * 3600)])
    assert engine.window("7", since_s=now - 3 * 3600, until_s=now - 3600).decisions == 24
    assert engine.window("7").by_decision.tolist() == [46, 0, 1]


def test_the_decision_index_costs_under_64_bytes_a_decision(tmp_path: Path) -> None:
    """The figure docs/monitoring.md sizes the state volume by: disk per indexed decision."""
    store = MonitorStore(tmp_path / "state.db")
    rng = np.random.default_rng(7)
    n = 50_000
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    for start in range(0, n, 10_000):
        rows = [
            (int(k), Decided("3", 493_000 + i % 24, i % 3, i % 120))
            for i, k in enumerate(keys[start : start + 10_000], start)
        ]
        store.save(rows, [], [], [], {})
    assert store.counts()["decided"] == n
    store.close()
    # Closing the last connection folds the write-ahead log into the file.
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    per_decision = size / n
    print(f"decision index: {per_decision:.1f} bytes a decision over {n} decisions")
    assert per_decision < 64


def test_cards_a_canary_failed_count_against_it_across_a_checkpoint(tmp_path: Path) -> None:
    ref = _reference(np.random.default_rng(9))
    engine = _engine(tmp_path / "state.db", ref)
    records = [decision(f"c{i}", 0.1) for i in range(10)]
    for i, record in enumerate(records[:4]):
        envelope = events_pb2.EventEnvelope.FromString(record.value)
        envelope.decision.canary_failed_version = "8"
        envelope.decision.canary_timed_out = i < 3
        records[i] = Record(record.key, envelope.SerializeToString(), "0")
    engine.apply(records)
    # Live answered all ten; the canary owes four of them, three timed out.
    assert engine.window("7").decisions == 10
    canary = engine.window("8", ("canary",))
    assert (canary.decisions, canary.failed, canary.timed_out) == (0, 4, 3)
    engine.checkpoint()
    engine.store.close()
    again = _engine(tmp_path / "state.db", ref).window("8", ("canary",))
    assert (again.failed, again.timed_out) == (4, 3)


def test_the_advice_file_is_in_the_state_folder_unless_given_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In a cluster the advice goes onto the shared state volume, where the autopilot's Job
    reads it; the rest of the monitor's state stays on its own volume."""
    from services.monitor.settings import MonitorSettings

    for name in ("FRAUD_MONITOR_VAR_DIR", "FRAUD_MONITOR_STATE_DIR", "FRAUD_MONITOR_ADVICE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FRAUD_MONITOR_VAR_DIR", str(tmp_path / "var"))
    assert MonitorSettings().advice_file == tmp_path / "var" / "monitor" / "advice.jsonl"
    monkeypatch.setenv("FRAUD_MONITOR_STATE_DIR", str(tmp_path / "own"))
    assert MonitorSettings().advice_file == tmp_path / "own" / "advice.jsonl"
    monkeypatch.setenv("FRAUD_MONITOR_ADVICE_DIR", str(tmp_path / "shared" / "monitor"))
    settings = MonitorSettings()
    assert settings.advice_file == tmp_path / "shared" / "monitor" / "advice.jsonl"
    assert settings.state_file == tmp_path / "own" / "state.db"
