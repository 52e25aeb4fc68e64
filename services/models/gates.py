"""Promotion gates: may a candidate replace the live version?

Three checks, each against the live version on the same inputs:

- **parity**: ONNX Runtime reproduces the trained model within ``parity_tolerance`` (the
  figure training measured on the whole holdout, recorded in the metadata);
- **average precision** of both ONNX models on the same holdout rows: the candidate may
  be worse than live by at most ``ap_tolerance``;
- **single-row latency**: the p99 of one-row inferences, measured here on both ONNX files
  interleaved (so both see the same machine noise), within ``latency_ratio`` of live's. Each
  row is run ``LATENCY_REPEATS`` times and counts with its fastest run: on a loaded machine
  about 1 % of calls may be preempted, and a p99 of single runs then lands on a fast call or
  a preempted one by chance, so that two identical models could part by fourfold or more.
  Noise only adds time, and it rarely falls on every run of a row; what a model itself
  spends on a row, it spends on every run.

Without a live version the candidate is judged on parity alone (its own figures are still
recorded). The holdout is given by feature name, so each model gets its own column order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from services.domain import metrics
from services.models import repository
from services.models.lifecycle import GateCheck, GateReport, ModelLifecycle
from services.models.onnx import OnnxModel


class GatePolicy(BaseModel):
    """The limits a candidate must meet."""

    model_config = ConfigDict(frozen=True)

    parity_tolerance: float = Field(
        1e-5, ge=0, description="Largest |trained model − ONNX Runtime| probability."
    )
    ap_tolerance: float = Field(
        0.01, ge=0, description="How far below live's average precision a candidate may be."
    )
    latency_ratio: float = Field(
        2.0, gt=0, description="Candidate single-row p99 at most this multiple of live's."
    )
    latency_calls: int = Field(
        3000, ge=100, description="Single-row inferences per model for the latency check."
    )
    seed: int = Field(7, description="Picks the holdout rows used for the latency check.")


def _matrix(model: OnnxModel, holdout: Mapping[str, Any]) -> np.ndarray:
    """The holdout in ``model``'s feature order, float32."""
    missing = [n for n in model.metadata.feature_order if n not in holdout]
    if missing:
        raise KeyError(f"the holdout lacks the features {missing}")
    columns = [np.asarray(holdout[n], dtype=np.float32) for n in model.metadata.feature_order]
    return np.ascontiguousarray(np.column_stack(columns))


LATENCY_REPEATS = 3
"""Runs of each row per model in the latency check; a row's time is its fastest run."""


def _single_row_p99(
    models: list[OnnxModel], matrices: list[np.ndarray], calls: int, seed: int
) -> list[float]:
    """p99 seconds over ``calls`` one-row inferences of each model, the models taking turns
    per row. A row's time is the fastest of ``LATENCY_REPEATS`` runs: the machine's noise
    (a preempted call, a cache another process emptied) only adds time, and it falls on one
    run, not on all three, whereas a row that is slow for the model itself (a deep path
    through its trees) is slow on every run."""
    rows = np.random.default_rng(seed).integers(0, len(matrices[0]), size=calls)
    times = np.full((len(models), calls), np.inf, dtype=np.float64)
    for model, matrix in zip(models, matrices, strict=True):
        for i in rows[:50]:
            model.predict(matrix[i : i + 1])
    clock = time.perf_counter
    for k, i in enumerate(rows):
        for repeat in range(LATENCY_REPEATS):
            # Alternate who goes first so neither always runs on a warmer cache.
            first = (k + repeat) % 2 == 0
            order = range(len(models)) if first else reversed(range(len(models)))
            for m in order:
                row = matrices[m][i : i + 1]
                started = clock()
                models[m].predict(row)
                times[m, k] = min(times[m, k], clock() - started)
    return [metrics.percentile(t, 99) for t in times]


def evaluate(
    candidate: repository.ModelMetadata,
    candidate_onnx: Path,
    holdout: Mapping[str, Any],
    labels: Any,
    model_root: Path,
    policy: GatePolicy | None = None,
    live_version: str | None = None,
) -> GateReport:
    """Judges the candidate (its metadata and ONNX file, not yet published) against the
    live version of ``candidate.name`` under ``model_root`` (or ``live_version``).

    ``holdout`` maps every feature name to a column (a DataFrame of the holdout works);
    ``labels`` are its fraud labels (1 = fraud).
    """
    policy = policy or GatePolicy()
    y = np.asarray(labels, dtype=np.int64)
    live = live_version or ModelLifecycle(model_root, candidate.name).read().routing.live
    checks = [
        GateCheck(
            name="parity",
            passed=candidate.parity_max_abs_diff <= policy.parity_tolerance,
            value=candidate.parity_max_abs_diff,
            limit=policy.parity_tolerance,
            detail=f"max |trained − ONNX| {candidate.parity_max_abs_diff:.2e} "
            f"(limit {policy.parity_tolerance:.0e})",
        )
    ]
    cand_model = OnnxModel(candidate, candidate_onnx.parent, threads=1, model_file=candidate_onnx)
    cand_x = _matrix(cand_model, holdout)
    cand_ap = metrics.average_precision(y, cand_model.predict(cand_x))
    if live is None:
        return _report(checks + _unopposed_checks(cand_model, cand_x, cand_ap, policy), None)

    try:
        live_meta, live_folder = repository.load(model_root, candidate.name, live)
        live_model = OnnxModel(live_meta, live_folder, threads=1)
        live_x = _matrix(live_model, holdout)
    except (KeyError, FileNotFoundError) as error:
        checks.append(
            GateCheck(
                name="average_precision",
                passed=False,
                value=_finite(cand_ap),
                limit=None,
                detail=f"cannot run live v{live} on this holdout: {error.args[0]}",
            )
        )
        return _report(checks, live)
    live_ap = metrics.average_precision(y, live_model.predict(live_x))
    floor = live_ap - policy.ap_tolerance
    checks.append(
        GateCheck(
            name="average_precision",
            passed=bool(np.isfinite(cand_ap) and cand_ap >= floor),
            value=_finite(cand_ap),
            limit=_finite(floor),
            detail=f"{cand_ap:.4f} vs live v{live} {live_ap:.4f} "
            f"(may be at most {policy.ap_tolerance:g} lower)",
        )
    )
    cand_p99, live_p99 = _single_row_p99(
        [cand_model, live_model], [cand_x, live_x], policy.latency_calls, policy.seed
    )
    limit = policy.latency_ratio * live_p99
    checks.append(
        GateCheck(
            name="latency_p99",
            passed=cand_p99 <= limit,
            value=cand_p99,
            limit=limit,
            detail=f"{cand_p99 * 1e6:.1f} µs vs live v{live} {live_p99 * 1e6:.1f} µs "
            f"(limit {policy.latency_ratio:g}×)",
        )
    )
    return _report(checks, live)


def _unopposed_checks(model: OnnxModel, x: Any, ap: float, policy: GatePolicy) -> list[GateCheck]:
    """The first version of a name has no live version to beat: its figures are recorded."""
    (p99,) = _single_row_p99([model], [x], policy.latency_calls, policy.seed)
    return [
        GateCheck(
            name="average_precision",
            passed=bool(np.isfinite(ap)),
            value=_finite(ap),
            limit=None,
            detail=f"{ap:.4f}; no live version to compare with",
        ),
        GateCheck(
            name="latency_p99",
            passed=True,
            value=p99,
            limit=None,
            detail=f"{p99 * 1e6:.1f} µs; no live version to compare with",
        ),
    ]


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def _report(checks: list[GateCheck], against: str | None) -> GateReport:
    return GateReport(
        passed=all(c.passed for c in checks),
        checks=checks,
        against=against,
        evaluated_at=datetime.now(UTC),
    )
