"""Promotion gates on real (tiny) ONNX models: parity, average precision, latency."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from services.domain.featurespec import MODEL_FEATURES
from services.models import gates
from services.models.lifecycle import ModelLifecycle

from .tiny_models import holdout, metadata, onnx_model, publish


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return {
        "good": onnx_model(folder / "good.onnx", trees=20),
        # The live model's twin from another file: exactly as good as live on any holdout.
        "twin": onnx_model(folder / "twin.onnx", trees=20),
        "useless": onnx_model(folder / "useless.onnx", trees=20, shuffle_labels=True),
    }


@pytest.fixture
def root(tmp_path: Path, models: dict[str, Path]) -> Path:
    root = tmp_path / "models"
    assert publish(root, models["good"], candidate=False) == "1"
    return root


def test_a_candidate_as_good_as_live_passes(root: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    report = gates.evaluate(
        metadata(), models["twin"], x, y, root, gates.GatePolicy(latency_ratio=1e6)
    )
    assert report.passed, report
    assert report.against == "1"
    assert [c.name for c in report.checks] == ["parity", "average_precision", "latency_p99"]
    ap = report.checks[1]
    assert ap.value is not None and ap.limit is not None and ap.value >= ap.limit
    assert "vs live v1" in ap.detail


def test_a_worse_candidate_fails_on_average_precision(root: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    report = gates.evaluate(
        metadata(), models["useless"], x, y, root, gates.GatePolicy(latency_ratio=1e6)
    )
    assert not report.passed
    assert [c.name for c in report.failures()] == ["average_precision"]


def test_parity_is_judged_from_the_metadata(root: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    report = gates.evaluate(
        metadata(parity_max_abs_diff=3e-4),
        models["good"],
        x,
        y,
        root,
        gates.GatePolicy(latency_ratio=1e6),
    )
    assert [c.name for c in report.failures()] == ["parity"]


def test_latency_is_measured_against_live(root: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    policy = gates.GatePolicy(latency_ratio=1e-9, latency_calls=200)
    report = gates.evaluate(metadata(), models["good"], x, y, root, policy)
    latency = report.checks[-1]
    assert latency.name == "latency_p99" and not latency.passed
    assert latency.value is not None and latency.value > 0
    assert latency.limit is not None and latency.limit < latency.value


def test_without_live_only_parity_can_fail(tmp_path: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    report = gates.evaluate(metadata(), models["useless"], x, y, tmp_path / "empty")
    assert report.passed and report.against is None
    assert "no live version" in report.checks[1].detail


def test_a_live_version_with_other_features_fails_the_comparison(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    root = tmp_path / "models"
    order = [*MODEL_FEATURES[:-1], "dropped_feature"]
    publish(
        root,
        models["good"],
        candidate=False,
        feature_order=order,
        default_features=dict.fromkeys(order, 0.0),
    )
    x, y = holdout()
    report = gates.evaluate(metadata(), models["good"], x, y, root)
    assert [c.name for c in report.failures()] == ["average_precision"]
    assert "dropped_feature" in report.failures()[0].detail


def test_a_holdout_without_the_candidates_features_is_an_error(
    root: Path, models: dict[str, Path]
) -> None:
    x, y = holdout()
    del x[MODEL_FEATURES[0]]
    with pytest.raises(KeyError, match=MODEL_FEATURES[0]):
        gates.evaluate(metadata(), models["good"], x, y, root)


def test_a_report_travels_with_the_candidate(root: Path, models: dict[str, Path]) -> None:
    x, y = holdout()
    report = gates.evaluate(
        metadata(), models["useless"], x, y, root, gates.GatePolicy(latency_ratio=1e6)
    )
    version = publish(root, models["useless"], gates=report)
    state = ModelLifecycle(root).read()
    assert state.versions[version].gates == report


class _Timed:
    """A stand-in model whose predictions take no time but for the calls numbered in
    ``slow``, which sleep ``seconds``: a machine that preempts one model's calls."""

    def __init__(self, slow: range, seconds: float) -> None:
        self.calls = 0
        self.slow = slow
        self.seconds = seconds

    def predict(self, _row: object) -> None:
        if self.calls in self.slow:
            time.sleep(self.seconds)
        self.calls += 1


class _SlowRows:
    """A stand-in model that is slow on the rows whose first value is 1, on every run: a
    model whose own cost depends on its input."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def predict(self, row: np.ndarray) -> None:
        if row[0, 0] == 1:
            time.sleep(self.seconds)


def test_preempted_calls_do_not_part_two_identical_models() -> None:
    # Every 20th call of one model is slow (5 %, four times the share a p99 allows), in every
    # part of the run: a p99 of single calls would be a slow one.
    warm = 50  # the warm-up calls come first
    calls = 3000 * gates.LATENCY_REPEATS
    preempted = _Timed(range(warm, warm + calls, 20), 0.005)
    steady = _Timed(range(0), 0.0)
    x = np.zeros((10, 3), dtype=np.float32)
    slow, fast = gates._single_row_p99([preempted, steady], [x, x], 3000, seed=1)  # type: ignore[list-item]
    assert slow < 0.001, (slow, fast)


def test_a_model_slow_on_some_rows_is_slow() -> None:
    # 3 of 100 rows are slow for one model on every run: its p99 is a slow row's.
    x = np.zeros((100, 3), dtype=np.float32)
    x[[7, 42, 91], 0] = 1
    slow, fast = gates._single_row_p99(
        [_SlowRows(0.002), _SlowRows(0.0)],  # type: ignore[list-item]
        [x, x],
        3000,
        seed=1,
    )
    assert slow >= 0.002 > 0.001 > fast
