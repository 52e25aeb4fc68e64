"""The model's quality on the default simulated data, before and after a change of training.

Two checkouts train on the same data: this one ("after") and an earlier commit ("before",
a checkout with its own ``make install``). Each runs what ``make data`` runs, with its own
code, in a fresh state folder:

    fraudmesh features simulate --seed 7 --end DAY --var-dir VAR   # the default world
    fraudmesh features apply --var-dir VAR
    fraudmesh train --var-dir VAR [--scores-out S]                 # the default periods

The comparison is made fair by construction and checked, not assumed:

- the same simulator seed and window end, passed explicitly (``FRAUD_*`` variables are
  removed from the children's environment; the end defaults to today, as in ``make data``;
  ``--end`` repeats an earlier run), and the transactions of both datasets compared id by
  id, with their labels;
- the same test period: both versions hold out the latest 20% of the days after a 7-day
  warm-up; the script reads each published version's window and stops if they differ;
- the same test rows and one judge: the after scores come from ``--scores-out``; an older
  ``fraudmesh train`` may not write scores, so the before scores are recomputed by the
  before checkout's own code (its point-in-time join, its population defaults, its published
  LightGBM model) and must reproduce the ROC-AUC and average precision that version
  recorded. Both score sets are then judged by this checkout's ``pipelines.evaluate``: ROC-AUC,
  average precision, recall at 1% false-positive rate (the threshold flagging 1% of the test
  period's genuine payments) and card precision at 100 per day, plus recall at that 1% point
  per fraud scenario. A paired bootstrap over the test period's cards gives the spread of
  each difference that sampling alone could produce.

    python -m loadtest.quality --before ../earlier-checkout [--end 2026-11-23]
        # writes loadtest/results/quality-before-after.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from loadtest import provenance
from services.domain import metrics
from services.featurestore import layout
from services.models import repository
from services.pipelines import evaluate

RESULTS = Path(__file__).with_name("results")
SEED = 7
"""The simulator's embedded default seed (``make data``)."""
BOOTSTRAP_RESAMPLES = 1000
"""Resamples of the test period's cards for the spread of each difference."""
BOOTSTRAP_SEED = 11
REPRODUCTION_TOLERANCE = 1e-9
"""Largest accepted difference between a recomputed metric and the one a version recorded."""

# Run by the before checkout's own Python in its own folder: its code rebuilds its holdout
# exactly as its ``fraudmesh train`` did and scores it with the LightGBM model it published.
_BEFORE_SCORES = """
import inspect, json, sys
from pathlib import Path
import lightgbm as lgb
import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score
from services.domain import featurespec
from services.featurestore.settings import from_env
from services.models import repository
from services.pipelines import train

var_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
metadata, folder = repository.load(var_dir / "models")
params = train.TrainParams()
frame = train._training_frame(from_env(var_dir=var_dir))
# The window's signature grew a periods argument when periods became explicit settings.
extra = [train.Periods()] if "periods" in inspect.signature(train._window).parameters else []
window = train._window(frame["timestamp"], params, *extra)
assert window.holdout_start == metadata.training_window.holdout_start
frame = frame[frame["timestamp"] >= window.start].reset_index(drop=True)
holdout = (frame["timestamp"] >= window.holdout_start).to_numpy()
defaults = featurespec.population_defaults(featurespec.model_frame(frame)[~holdout])
x = featurespec.model_frame(frame, defaults).to_numpy(dtype=np.float32)
y = frame["is_fraud"].to_numpy(dtype=np.int32)
booster = lgb.Booster(model_file=str(folder / "lightgbm.txt"))
scores = np.asarray(booster.predict(x[holdout].astype(np.float64)), dtype=np.float64)
tested = frame.loc[holdout, ["transaction_id", "timestamp", "card_id"]].reset_index(drop=True)
tested["score"] = scores
tested["is_fraud"] = y[holdout].astype(bool)
tested.to_parquet(out, index=False)
print(json.dumps({
    "roc_auc": float(roc_auc_score(y[holdout], scores)),
    "pr_auc": float(average_precision_score(y[holdout], scores)),
    "recorded": {k: metadata.metrics[k] for k in ("roc_auc", "pr_auc") if k in metadata.metrics},
    "window": {
        "train_from": metadata.training_window.start.isoformat(),
        "test_from": metadata.training_window.holdout_start.isoformat(),
        "test_until": metadata.training_window.end.isoformat(),
    },
    "trees": booster.num_trees(),
    "features": list(metadata.feature_order),
}))
"""


def _environment() -> dict[str, str]:
    """This environment without the project's settings variables (defaults only)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}


def _run(argv: list[str], log: Path, cwd: Path | None = None) -> float:
    """Runs ``argv`` to completion with the default settings; its wall time in seconds."""
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=_environment(), check=False
        )
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}); see {log}")
    return round(time.perf_counter() - started, 1)


def _commit(checkout: Path) -> str:
    """The last commit that changed the product's code (``services/``) in ``checkout``;
    ``+local changes`` when that code differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    commit = git("log", "-1", "--format=%h", "--", "services")
    return commit + (" +local changes" if git("status", "--porcelain", "--", "services") else "")


def _make_data(
    fraudmesh: Path, var_dir: Path, work: Path, label: str, cwd: Path, end: date
) -> float:
    """``make data``'s simulate and apply steps; their wall time."""
    seconds = 0.0
    for step in (
        ["features", "simulate", "--seed", str(SEED), "--end", end.isoformat()],
        ["features", "apply"],
    ):
        argv = [str(fraudmesh), *step, "--var-dir", str(var_dir)]
        seconds += _run(argv, work / f"{label}-{step[1]}.log", cwd)
    return seconds


def _same_transactions(before: Path, after: Path) -> dict[str, int]:
    """Checks that both datasets hold the same transactions with the same labels."""
    columns = ["transaction_id", "timestamp", "card_id", "is_fraud"]
    a = pd.read_parquet(before / layout.TRANSACTIONS_FILE, columns=columns)
    b = pd.read_parquet(after / layout.TRANSACTIONS_FILE, columns=columns)
    a, b = (t.sort_values("transaction_id").reset_index(drop=True) for t in (a, b))
    if len(a) != len(b) or not a.astype(str).equals(b.astype(str)):
        raise SystemExit("the two checkouts simulated different transactions: no fair comparison")
    return {"transactions": len(b), "frauds": int(b["is_fraud"].sum())}


def judge(scores: pd.DataFrame, scenarios: pd.Series) -> dict[str, object]:
    """The figures of one score set on its test rows, by this checkout's evaluation."""
    y = scores["is_fraud"].to_numpy().astype(np.int8)
    s = scores["score"].to_numpy(dtype=np.float64)
    days = pd.to_datetime(scores["timestamp"], utc=True).dt.floor("D").to_numpy()
    # Thresholds only matter for operating points not reported here; one for both versions.
    at_fpr = metrics.threshold_at_fpr(s[y == 0], evaluate.RECALL_AT_FPR)
    judged = evaluate.evaluate(
        y, s, review=at_fpr, decline=at_fpr, days=days, cards=scores["card_id"].to_numpy(),
        scenarios=scores["transaction_id"].map(scenarios).to_numpy(),
    )  # fmt: skip
    return {
        "roc_auc": judged.roc_auc,
        "average_precision": judged.average_precision,
        "recall_at_1pct_fpr": judged.recall_at_1pct_fpr,
        "card_precision_at_100": judged.card_precision_at_k,
        "card_precision_at_100_ceiling": judged.card_precision_ceiling,
        "recall_at_1pct_fpr_by_scenario": judged.recall_at_review_by_scenario,
        "frauds_by_scenario": {
            str(k): int(v)
            for k, v in scores.loc[y == 1, "transaction_id"].map(scenarios).value_counts().items()
        },
        "test_rows": len(y),
        "test_frauds": int(y.sum()),
    }


def paired_bootstrap(
    before: pd.DataFrame, after: pd.DataFrame, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, dict[str, float]]:
    """How much of each difference (after − before) sampling alone could produce.

    Both versions scored the same test rows; resampling *cards* with replacement (a card's
    payments stay together: frauds of one compromised card are not independent) and judging
    both versions on each resample gives the spread of the difference. Returns, per metric,
    the 2.5th and 97.5th percentiles of the difference and the share of resamples where the
    after version is better.
    """
    joined = before[["transaction_id", "card_id", "is_fraud", "score"]].merge(
        after[["transaction_id", "score"]], on="transaction_id", suffixes=("_before", "_after")
    )
    y = joined["is_fraud"].to_numpy().astype(np.int8)
    scores = {v: joined[f"score_{v}"].to_numpy(dtype=np.float64) for v in ("before", "after")}
    sampler = metrics.Resampler(groups=joined["card_id"].to_numpy(), seed=BOOTSTRAP_SEED)
    differences: dict[str, list[float]] = {name: [] for name in _BOOTSTRAPPED}
    for _ in range(resamples):
        rows = sampler.draw()
        if y[rows].min() == y[rows].max():
            continue
        figures = {v: _row_metrics(y[rows], s[rows]) for v, s in scores.items()}
        for name in _BOOTSTRAPPED:
            differences[name].append(figures["after"][name] - figures["before"][name])
    return {
        name: {
            "low": metrics.percentile(values, 2.5),
            "high": metrics.percentile(values, 97.5),
            "after_better_share": float(np.mean(np.asarray(values) > 0)),
            "resamples": len(values),
        }
        for name, values in differences.items()
    }


_BOOTSTRAPPED = ("roc_auc", "average_precision", "recall_at_1pct_fpr")


def _row_metrics(y: np.ndarray, s: np.ndarray) -> dict[str, float]:
    """The per-payment metrics of ``evaluate`` (card precision needs days; left out)."""
    return {
        "roc_auc": metrics.roc_auc(y, s),
        "average_precision": metrics.average_precision(y, s),
        "recall_at_1pct_fpr": metrics.recall_at_fpr(y, s, evaluate.RECALL_AT_FPR),
    }


def run(before_checkout: Path, work: Path, end: date) -> dict[str, object]:
    """Builds both datasets and models, checks the comparison is fair, judges both."""
    here = Path(__file__).resolve().parents[1]
    after_fraudmesh = Path(sys.executable).parent / "fraudmesh"
    before_venv = before_checkout / ".venv" / "bin"
    if not after_fraudmesh.is_file() or not (before_venv / "fraudmesh").is_file():
        raise SystemExit("both checkouts need `make install`")
    load_before = os.getloadavg()[0]
    seconds: dict[str, float] = {}

    after_var, before_var = work / "after", work / "before"
    print("after: simulate, apply, train …")
    seconds["after_data"] = _make_data(after_fraudmesh, after_var, work, "after", here, end)
    after_scores_path = work / "after-scores.parquet"
    seconds["after_train"] = _run(
        [str(after_fraudmesh), "train", "--var-dir", str(after_var),
         "--scores-out", str(after_scores_path)],
        work / "after-train.log", here,
    )  # fmt: skip
    print("before: simulate, apply, train …")
    seconds["before_data"] = _make_data(
        before_venv / "fraudmesh", before_var, work, "before", before_checkout, end
    )
    seconds["before_train"] = _run(
        [str(before_venv / "fraudmesh"), "train", "--var-dir", str(before_var)],
        work / "before-train.log",
        before_checkout,
    )
    before_scores_path = work / "before-scores.parquet"
    reproduced = subprocess.run(
        [str(before_venv / "python"), "-c", _BEFORE_SCORES, str(before_var), str(before_scores_path)],
        cwd=before_checkout, env=_environment(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if reproduced.returncode != 0:
        raise SystemExit(f"recomputing the before scores failed:\n{reproduced.stderr}")
    before_check = json.loads(reproduced.stdout.strip().splitlines()[-1])
    for name, recorded in before_check["recorded"].items():
        if abs(before_check[name] - recorded) > REPRODUCTION_TOLERANCE:
            raise SystemExit(
                f"the recomputed before {name} {before_check[name]} is not the recorded {recorded}"
            )

    data = _same_transactions(before_var / "data", after_var / "data")
    after_meta, after_folder = repository.load(after_var / "models")
    after_window = after_meta.training_window
    window = before_check["window"]
    if (
        window["test_from"] != after_window.holdout_start.isoformat()
        or window["test_until"] != after_window.end.isoformat()
    ):
        raise SystemExit(f"different test periods: before {window}, after {after_window}")
    before_scores = pd.read_parquet(before_scores_path)
    after_scores = pd.read_parquet(after_scores_path)
    ids = [
        t.sort_values("transaction_id")[["transaction_id", "is_fraud"]].reset_index(drop=True)
        for t in (before_scores, after_scores)
    ]
    if not ids[0].astype(str).equals(ids[1].astype(str)):
        raise SystemExit("the two versions scored different test rows")

    tx = pd.read_parquet(
        after_var / "data" / layout.TRANSACTIONS_FILE, columns=["transaction_id", "fraud_scenario"]
    )
    scenarios = tx.set_index("transaction_id")["fraud_scenario"]
    before = judge(before_scores, scenarios)
    after = judge(after_scores, scenarios)
    recorded_after = after_meta.metrics
    for name, key in (("roc_auc", "roc_auc"), ("average_precision", "pr_auc")):
        value = after[name]
        assert isinstance(value, float)
        if abs(value - recorded_after[key]) > REPRODUCTION_TOLERANCE:
            raise SystemExit(f"after {name} {value} is not the recorded {recorded_after[key]}")
    selection = json.loads((after_folder / "selection.json").read_text())
    print("paired bootstrap over cards …")
    spread = paired_bootstrap(before_scores, after_scores)
    return {
        "seed": SEED,
        "end": end.isoformat(),
        "data": data,
        "periods": {
            "test": [window["test_from"], window["test_until"]],
            "before_train": [window["train_from"], window["test_from"]],
            "after_train": [
                after_window.start.isoformat(),
                after_window.validation_start.isoformat() if after_window.validation_start else "",
            ],
            "after_validation": [
                after_window.validation_start.isoformat() if after_window.validation_start else "",
                after_window.train_end.isoformat() if after_window.train_end else "",
            ],
        },
        "before": {
            "commit": _commit(before_checkout),
            "trees": before_check["trees"],
            "features": before_check["features"],
            "recorded": before_check["recorded"],
            **before,
        },
        "after": {
            "commit": _commit(here),
            "selection": selection,
            "features": list(after_meta.feature_order),
            "recorded": {k: recorded_after[k] for k in ("roc_auc", "pr_auc")},
            **after,
        },
        "difference_95pct": spread,
        "seconds": seconds,
        "load_avg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }


_METRICS = (
    ("ROC-AUC", "roc_auc"),
    ("average precision (PR-AUC)", "average_precision"),
    ("recall at 1% FPR", "recall_at_1pct_fpr"),
    ("card precision at 100 (mean per day)", "card_precision_at_100"),
)


def markdown(results: dict[str, object]) -> str:
    """The comparison as a Markdown table."""
    before, after = results["before"], results["after"]
    periods, data = results["periods"], results["data"]
    assert isinstance(before, dict) and isinstance(after, dict)
    assert isinstance(periods, dict) and isinstance(data, dict)
    test = periods["test"]
    lines = [
        f"Default simulated data (seed {results['seed']}, window ending {results['end']}): "
        f"{data['transactions']:,} transactions, "
        f"{data['frauds']:,} frauds, identical in both checkouts. Test period "
        f"{test[0][:10]} → {test[1][:10]} (exclusive): {after['test_rows']:,} payments, "
        f"{after['test_frauds']:,} frauds, the same rows for both; every figure below is "
        "computed from the two versions' test scores by the same evaluation code.",
        "",
        f"| metric | before ({before['commit']}) | after ({after['commit']}) | after − before "
        "| 95% range of the difference (cards resampled) | resamples where after is better |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    spread = results["difference_95pct"]
    assert isinstance(spread, dict)
    for label, key in _METRICS:
        cells = "| — | — |"
        if key in spread:
            d = spread[key]
            cells = f"| {d['low']:+.4f} … {d['high']:+.4f} | {d['after_better_share']:.0%} |"
        lines.append(
            f"| {label} | {before[key]:.4f} | {after[key]:.4f} "
            f"| {after[key] - before[key]:+.4f} {cells}"
        )
    ceiling = after["card_precision_at_100_ceiling"]
    lines.append(
        f"| … its ceiling (every fraudulent card first) | {ceiling:.4f} | {ceiling:.4f} | | | |"
    )
    lines += [
        "",
        "| recall at 1% FPR, by fraud scenario | test frauds | before | after | after − before |",
        "|---|---:|---:|---:|---:|",
    ]
    frauds = after["frauds_by_scenario"]
    for scenario, value in after["recall_at_1pct_fpr_by_scenario"].items():
        old = before["recall_at_1pct_fpr_by_scenario"].get(scenario, float("nan"))
        lines.append(
            f"| {scenario} | {frauds.get(scenario, 0)} | {old:.4f} | {value:.4f} "
            f"| {value - old:+.4f} |"
        )
    train_b, train_a, valid_a = (
        periods["before_train"],
        periods["after_train"],
        periods["after_validation"],
    )
    chosen = ", ".join(
        f"{c['num_leaves']:.0f} leaves"
        + (
            f" with {c['optional_features']:.0f} optional features"
            if c.get("optional_features")
            else ""
        )
        + f": {c['trees']:.0f} trees, validation AP {c['validation_average_precision']:.4f}"
        + (" (selected)" if c.get("selected") else "")
        for c in after["selection"]
    )
    added = [name for name in after["features"] if name not in before["features"]]
    dropped = [name for name in before["features"] if name not in after["features"]]
    lines += [
        "",
        f"- before: {len(before['features'])} model features, {before['trees']} trees (fixed), "
        f"fitted on {train_b[0][:10]} → {train_b[1][:10]}; its review threshold was chosen on "
        "the test period.",
        f"- after: {len(after['features'])} model features, fitted on {train_a[0][:10]} → "
        f"{train_a[1][:10]}, model and thresholds chosen on the validation period "
        f"{valid_a[0][:10]} → {valid_a[1][:10]} ({chosen}).",
        f"- features added: {', '.join(added) or 'none'}; dropped: {', '.join(dropped) or 'none'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs both checkouts and writes ``loadtest/results/quality-before-after.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, required=True, help="a checkout of the earlier commit, installed"
    )
    parser.add_argument(
        "--end",
        type=date.fromisoformat,
        default=datetime.now(UTC).date(),
        help="the simulated window's end (YYYY-MM-DD, exclusive; default today, as make data)",
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS / "quality-before-after")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fraudmesh-quality-", dir=args.work) as tmp:
        results = run(args.before.resolve(), Path(tmp), args.end)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(results)
    provenance.write(args.out, results, table, provenance.record())
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
