"""The monitor with a cascade: the score compared with the distribution the version answers
with (the cascade's when first-stage answers come, the full model's otherwise), fallback
answers kept out of it, and references and checkpoints written before the cascade still
read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fraud.v1 import events_pb2
from fraud.v1 import scoring_pb2 as pb
from services.eventlog import Record
from services.models import reference as references
from services.monitor import tally
from services.monitor.tally import Layout

from .test_monitor import NAMES, THRESHOLDS, _engine, decision

CLEAR = 0.02


def _scores(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The full model's and the small model's scores of the same payments."""
    full = rng.beta(0.5, 6.0, n)
    # A shallow model scores the clear cases lower than the full model.
    small = np.clip(0.3 * full * rng.lognormal(0.0, 0.3, n), 0.0, 1.0)
    return full, small


def _cascade_reference(rng: np.random.Generator, n: int = 8000) -> references.ModelReference:
    full, small = _scores(rng, n)
    x = rng.gamma(2.0, 10.0, (n, len(NAMES)))
    x[:, NAMES.index("merchant_category")] = 5411.0
    answered = np.where(small < CLEAR, small, full)
    return references.fit(
        full, x, NAMES, THRESHOLDS, ("2026-01-01", "2026-01-08"), answered=answered
    )


def _batch(scores: np.ndarray, engines: np.ndarray) -> tally.Scored:
    n = len(scores)
    return tally.Scored(
        scores=scores,
        decisions=np.zeros(n, int),
        rules=engines == tally.RULES,
        sources=np.zeros(n, int),
        latency_ms=np.full(n, 2.0),
        engines=engines,
    )


def test_the_answered_distribution_round_trips_and_old_references_still_load(
    tmp_path: Path,
) -> None:
    ref = _cascade_reference(np.random.default_rng(1))
    assert ref.answered is not None
    ref.write(tmp_path)
    assert references.load(tmp_path) == ref
    assert ref.score_reference(True) is ref.answered
    assert ref.score_reference(False) is ref.score
    # A reference written before the cascade: no ``answered_score`` key, still monitored.
    data = json.loads((tmp_path / references.REFERENCE_FILE).read_text())
    del data["answered_score"]
    (tmp_path / references.REFERENCE_FILE).write_text(json.dumps(data))
    old = references.load(tmp_path)
    assert old is not None and old.answered is None
    assert old.score_reference(True) is old.score
    assert Layout.of(old).empty().answered_bins.size == 0


def test_cascade_answers_are_judged_against_the_cascade_and_fallbacks_left_out() -> None:
    rng = np.random.default_rng(2)
    ref = _cascade_reference(rng)
    assert ref.answered is not None
    layout = Layout.of(ref)
    full, small = _scores(rng, 4000)
    first = small < CLEAR
    answered = np.where(first, small, full)
    engines = np.where(first, tally.FIRST_STAGE, tally.MODEL)
    # Fallback answers with scores far from both: they must not move the score's PSI.
    fallback = np.full(600, 0.9)
    fallback_engines = np.r_[np.full(300, tally.SMALL_MODEL), np.full(300, tally.RULES)]
    into = layout.empty()
    tally.count(layout, _batch(answered, engines), into)
    tally.count(layout, _batch(fallback, fallback_engines), into)
    into = tally.Tally.decode(into.encode())
    drift = tally.drift(layout, into, min_decisions=500)
    assert drift.score_against == "cascade"
    assert drift.scored == 4000 and drift.decisions == 4600
    assert drift.score_psi == pytest.approx(ref.answered.psi(answered), rel=1e-12)
    assert drift.score_psi < 0.02
    # What the monitor compared before: the cascade's answers against the full model's scores.
    assert ref.score.psi(answered) > 0.2
    assert into.engines.tolist() == [int((~first).sum()), int(first.sum()), 300, 300]
    assert into.rules == 300


def test_without_first_stage_answers_the_full_models_distribution_is_used() -> None:
    rng = np.random.default_rng(3)
    ref = _cascade_reference(rng)
    layout = Layout.of(ref)
    full, _ = _scores(rng, 3000)
    into = layout.empty()
    tally.count(layout, _batch(full, np.full(len(full), tally.MODEL)), into)
    drift = tally.drift(layout, into, min_decisions=500)
    assert drift.score_against == "model"
    assert drift.score_psi == pytest.approx(ref.score.psi(full), rel=1e-12)
    assert drift.score_psi < 0.02
    # Too few of the version's own answers for a PSI, however many fallbacks.
    few = layout.empty()
    tally.count(layout, _batch(full[:100], np.full(100, tally.MODEL)), few)
    tally.count(layout, _batch(full[:900], np.full(900, tally.RULES)), few)
    assert math.isnan(tally.drift(layout, few, min_decisions=500).score_psi)


def test_a_version_without_a_small_model_compares_first_stage_scores_with_the_model() -> None:
    rng = np.random.default_rng(4)
    ref = _cascade_reference(rng)
    plain = references.ModelReference(
        ref.period, ref.rows, ref.score, ref.features, ref.thresholds, ref.decision_rates
    )
    layout = Layout.of(plain)
    scores = rng.beta(0.5, 6.0, 1000)
    into = layout.empty()
    tally.count(layout, _batch(scores, np.full(1000, tally.FIRST_STAGE)), into)
    drift = tally.drift(layout, into, min_decisions=500)
    assert drift.score_against == "model"
    assert drift.score_psi == pytest.approx(plain.score.psi(scores), rel=1e-12)


def test_a_checkpoint_of_an_older_build_decodes() -> None:
    ref = _cascade_reference(np.random.default_rng(5))
    into = Layout.of(ref).empty()
    into.decisions, into.rules = 12, 2
    into.score_bins[0] = 10
    arrays = [
        np.asarray(getattr(into, n), np.int64).ravel()
        for n in tally.Tally._ARRAYS[: tally.Tally._BEFORE_CASCADE]
    ]
    head = np.array([12, 2, 0, 0, 0, *(len(a) for a in arrays)], np.int64)
    old = tally.Tally.decode(np.concatenate([head, *arrays]).astype("<i8").tobytes())
    assert (old.decisions, old.rules, int(old.score_bins[0])) == (12, 2, 10)
    assert old.answered_bins.size == 0 and old.engines.tolist() == [0, 0, 0, 0]
    assert not Layout.of(ref).fits(old)


def _answer(tid: str, score: float, scored_by: int) -> Record:
    record = decision(tid, score)
    envelope = events_pb2.EventEnvelope.FromString(record.value)
    envelope.decision.scored_by = scored_by
    return Record(record.key, envelope.SerializeToString(), record.position)


def test_the_engine_reads_who_answered_from_scored_by(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    ref = _cascade_reference(rng)
    assert ref.answered is not None
    engine = _engine(tmp_path / "state.db", ref, min_decisions=500)
    full, small = _scores(rng, 1500)
    first = small < CLEAR
    records = [
        _answer(
            f"t{i}",
            float(small[i] if first[i] else full[i]),
            pb.SCORED_BY_FIRST_STAGE if first[i] else pb.SCORED_BY_MODEL,
        )
        for i in range(1500)
    ]
    records += [_answer(f"f{i}", 0.95, pb.SCORED_BY_SMALL_MODEL) for i in range(100)]
    records += [_answer(f"r{i}", 0.95, pb.SCORED_BY_RULES) for i in range(100)]
    engine.apply(records)
    window = engine.window("7")
    drift = tally.drift(engine.layout("7"), window, 500)
    assert drift.score_against == "cascade"
    answered = np.where(first, small, full)
    assert drift.score_psi == pytest.approx(ref.answered.psi(answered), rel=1e-9)
    assert window.engines.tolist() == [int((~first).sum()), int(first.sum()), 100, 100]
    assert window.rules == 100
