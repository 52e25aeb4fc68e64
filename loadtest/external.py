"""Quality on data that is not ours: the handbook's simulated card-fraud dataset.

"Reproducible Machine Learning for Credit Card Fraud Detection - Practical Handbook"
(Le Borgne, Siblini, Lebichot, Bontempi; ULB / Worldline) publishes a transaction generator
and baseline results on its output. This module regenerates that dataset with the
handbook's published procedure and parameters (5,000 customers, 10,000 terminals, 183 days
from 2018-04-01, terminals within radius 5 of a customer; fraud: amounts above 220; two
terminals compromised each day for 28 days; three customers compromised each day, a third
of their payments over 14 days multiplied by five), with numpy's generator instead of the
handbook's seeding, so the rows differ but the distributions are the same.

It then runs fraudmesh as a user would: ``fraudmesh data import`` with ``--map`` from the
handbook's column names, ``fraudmesh train`` with the handbook's periods (training
2018-07-25 → 08-01, a 7-day delay, test 2018-08-08 → 08-15) and ``--scores-out``, and
judges the scores with the handbook's protocol: test transactions of customers already
known to be compromised (a fraud labelled by the day before the delay) are left out, and
card precision at 100 leaves out cards detected on earlier days. ``--history`` adds a run
on the whole history before the same gap (2018-04-08 → 08-01), as a team with history would.
Each run's figures also put the cascade, the small model alone and the rules beside the model
on every test payment, judged against the cascade's quality targets
(``loadtest/cascade_quality.py``).

One regeneration is one draw: the figures move by about 0.01-0.02 between seeds, as much as
many changes of training do. So it runs several seeds (``--seeds``), reports the mean and
standard deviation of each figure, and with ``--before`` (an installed checkout of an
earlier commit) trains that version on the same data, each version importing with its own
code, and reports the per-seed differences: their spread is the noise a comparison has.

    python -m loadtest.external --before ../earlier-checkout
        # writes loadtest/results/external-handbook.{json,md}
    python -m loadtest.external --bounds-only --out loadtest/results/external-bounds-stored
        # only the rankings no model can beat (card_precision_bounds), in seconds

Published baselines (handbook, section 3.4 "Baseline fraud detection system", test set):
``BASELINES``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtest import cascade_quality, provenance
from services.domain import metrics
from services.domain.aggregation import FRAUD_RATE_WINDOW

RESULTS = Path(__file__).with_name("results")
START = pd.Timestamp("2018-04-01")
BASELINES: dict[str, tuple[float, float, float]] = {
    "Logistic regression": (0.871, 0.606, 0.291),
    "Decision tree, depth 2": (0.763, 0.496, 0.241),
    "Decision tree, unlimited depth": (0.788, 0.309, 0.243),
    "Random forest": (0.867, 0.658, 0.287),
    "XGBoost": (0.862, 0.639, 0.273),
}
"""Model → (AUC ROC, average precision, card precision at 100) on the handbook's test set."""
BEST_PUBLISHED: dict[str, float] = {
    "auc_roc": 0.879,
    "average_precision": 0.694,
    "card_precision_at_100": 0.304,
}
"""The best figure per column the handbook publishes for any model on this test set (its
model-selection chapter's tuned models included): the bar to clear."""
MAPPING = {
    "transaction_id": "TRANSACTION_ID",
    "timestamp": "TX_DATETIME",
    "card_id": "CUSTOMER_ID",
    # The handbook has terminals and no merchants: a terminal is both.
    "merchant_id": "TERMINAL_ID",
    "terminal_id": "TERMINAL_ID",
    "amount": "TX_AMOUNT",
    "is_fraud": "TX_FRAUD",
    "fraud_scenario": "TX_FRAUD_SCENARIO",
}
TRAIN_FROM, TRAIN_UNTIL = "2018-07-25", "2018-08-01"
TEST_FROM, TEST_UNTIL = "2018-08-08", "2018-08-15"
HISTORY_FROM = "2018-04-08"
DELAY_DAYS = 7


def generate(
    seed: int = 0,
    n_customers: int = 5_000,
    n_terminals: int = 10_000,
    days: int = 183,
    radius: float = 5.0,
) -> pd.DataFrame:
    """The handbook's simulated transactions with its three fraud scenarios."""
    rng = np.random.default_rng(seed)
    customer_xy = rng.uniform(0, 100, size=(n_customers, 2))
    mean_amount = rng.uniform(5, 100, size=n_customers)
    std_amount = mean_amount / 2
    rate = rng.uniform(0, 4, size=n_customers)
    terminal_xy = rng.uniform(0, 100, size=(n_terminals, 2))

    # Terminals within the radius of each customer, as one flat list with offsets.
    reach: list[np.ndarray] = []
    for lo in range(0, n_customers, 500):
        block = customer_xy[lo : lo + 500, None, :] - terminal_xy[None, :, :]
        near = np.hypot(block[..., 0], block[..., 1]) < radius
        reach += [np.flatnonzero(row) for row in near]
    sizes = np.array([len(r) for r in reach])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    flat = np.concatenate(reach)

    counts = rng.poisson(np.repeat(rate[:, None], days, axis=1))
    customer = np.repeat(np.repeat(np.arange(n_customers), days), counts.ravel())
    day = np.repeat(np.tile(np.arange(days), n_customers), counts.ravel())
    n = len(customer)
    # Around noon; int() truncates toward zero, as the handbook's does.
    seconds = np.trunc(rng.normal(86_400 / 2, 20_000, size=n)).astype(np.int64)
    amount = rng.normal(mean_amount[customer], std_amount[customer])
    negative = amount < 0
    amount[negative] = rng.uniform(0, 2 * mean_amount[customer[negative]])
    amount = np.round(amount, 2)
    keep = (seconds > 0) & (seconds < 86_400) & (sizes[customer] > 0)
    pick = np.floor(rng.random(n) * np.maximum(sizes[customer], 1)).astype(np.int64)
    terminal = flat[np.minimum(offsets[customer] + pick, len(flat) - 1)]
    tx = pd.DataFrame(
        {
            "TX_TIME_SECONDS": (seconds + day * 86_400)[keep],
            "TX_TIME_DAYS": day[keep],
            "CUSTOMER_ID": customer[keep],
            "TERMINAL_ID": terminal[keep],
            "TX_AMOUNT": amount[keep],
        }
    )
    tx = tx.sort_values("TX_TIME_SECONDS", kind="stable").reset_index(drop=True)
    tx.insert(0, "TRANSACTION_ID", np.arange(len(tx)))
    tx.insert(1, "TX_DATETIME", START + pd.to_timedelta(tx["TX_TIME_SECONDS"], unit="s"))

    fraud = np.zeros(len(tx), dtype=np.int8)
    scenario = np.zeros(len(tx), dtype=np.int8)
    over = (tx["TX_AMOUNT"] > 220).to_numpy()
    fraud[over], scenario[over] = 1, 1
    tx_day = tx["TX_TIME_DAYS"].to_numpy()
    tx_terminal = tx["TERMINAL_ID"].to_numpy()
    tx_customer = tx["CUSTOMER_ID"].to_numpy()
    amounts = tx["TX_AMOUNT"].to_numpy().copy()
    last = int(tx_day.max())
    for d in range(last):
        compromised = rng.choice(n_terminals, size=2, replace=False)
        hit = (tx_day >= d) & (tx_day < d + 28) & np.isin(tx_terminal, compromised)
        fraud[hit], scenario[hit] = 1, 2
    for d in range(last):
        victims = rng.choice(n_customers, size=3, replace=False)
        rows = np.flatnonzero((tx_day >= d) & (tx_day < d + 14) & np.isin(tx_customer, victims))
        chosen = rng.choice(rows, size=len(rows) // 3, replace=False)
        amounts[chosen] *= 5
        fraud[chosen], scenario[chosen] = 1, 3
    tx["TX_AMOUNT"] = np.round(amounts, 2)
    tx["TX_FRAUD"] = fraud
    tx["TX_FRAUD_SCENARIO"] = scenario
    return tx


def handbook_metrics(tx: pd.DataFrame, scores: pd.DataFrame, k: int = 100) -> dict[str, Any]:
    """AUC ROC, average precision and card precision at ``k`` under the handbook's protocol,
    its bounds (``card_precision_bounds``) and where the model misses (``missed_cards``)."""
    scored = tx.merge(
        scores[["transaction_id", "score"]].assign(
            TRANSACTION_ID=scores["transaction_id"].astype(np.int64)
        ),
        on="TRANSACTION_ID",
    )
    test = protocol_test_rows(tx, scored)
    y, scores = test["TX_FRAUD"].to_numpy(), test["score"].to_numpy(dtype=np.float64)
    _, precisions = metrics.card_precision_per_day(
        test["TX_TIME_DAYS"].to_numpy(), test["CUSTOMER_ID"].to_numpy(), y, scores, k,
        exclude_detected=True, divide_by_k=True,
    )  # fmt: skip
    return {
        "auc_roc": metrics.roc_auc(y, scores),
        "average_precision": metrics.average_precision(y, scores),
        f"card_precision_at_{k}": float(np.mean(precisions)),
        "test_rows": float(len(test)),
        "test_frauds": float(test["TX_FRAUD"].sum()),
        **card_precision_bounds(tx, test, k),
        "missed_cards": missed_cards(tx, test, k),
    }


def protocol_test_rows(tx: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The test days' rows of ``rows`` (a selection of ``tx``'s columns and rows) that the
    handbook's protocol judges: those of cards not yet known to be compromised."""
    first_test_day = (pd.Timestamp(TEST_FROM) - START).days
    train_days = (pd.Timestamp(TRAIN_FROM) - START).days, (pd.Timestamp(TRAIN_UNTIL) - START).days
    in_train = (tx["TX_TIME_DAYS"] >= train_days[0]) & (tx["TX_TIME_DAYS"] < train_days[1])
    known = set(tx.loc[in_train & (tx["TX_FRAUD"] == 1), "CUSTOMER_ID"])
    kept = []
    for offset in range((pd.Timestamp(TEST_UNTIL) - pd.Timestamp(TEST_FROM)).days):
        day = first_test_day + offset
        # Frauds of the delay period's days become known one day at a time.
        seen = tx[(tx["TX_TIME_DAYS"] == day - DELAY_DAYS - 1) & (tx["TX_FRAUD"] == 1)]
        known |= set(seen["CUSTOMER_ID"])
        today = rows[rows["TX_TIME_DAYS"] == day]
        kept.append(today[~today["CUSTOMER_ID"].isin(known)])
    return pd.concat(kept)


def card_precision_bounds(tx: pd.DataFrame, test: pd.DataFrame, k: int = 100) -> dict[str, float]:
    """Card precision at ``k`` of three rankings no model can beat, on the same test rows:

    - ``ceiling``: every fraudulent card first, each day;
    - ``reachable``: first the cards with a fraud that the payment or a known label reveals,
      then the genuine cards, the other fraudulent cards last. A fraud is revealed by its
      amount (scenarios 1 and 3: above 220, or five times the card's usual) or, on a
      compromised terminal (scenario 2), by a fraud at that terminal whose label is known by
      then and still inside the longest fraud-rate window (between ``DELAY_DAYS`` and
      ``DELAY_DAYS`` + 28 days earlier). A terminal compromised less than the label delay
      ago shows nothing: the payment is ordinary and no label has come back yet;
    - ``stored``: the same with the terminal's labels as the online store holds them when the
      payment is scored: its row as of the terminal's previous payment, so a label that came
      back since then reveals nothing yet (docs/training.md, "What the store's row costs").
    """
    y = test["TX_FRAUD"].to_numpy().astype(bool)
    days, cards = test["TX_TIME_DAYS"].to_numpy(), test["CUSTOMER_ID"].to_numpy()
    at_s = test["TX_TIME_SECONDS"].to_numpy(dtype=np.int64)
    terminals = test["TERMINAL_ID"].to_numpy()
    scenario = test["TX_FRAUD_SCENARIO"].to_numpy()
    rankings = {"ceiling": y.astype(np.float64)}
    for name, known_at in (("reachable", at_s), ("stored", _previous_payment(tx, terminals, at_s))):
        revealed = y & ((scenario != 2) | _terminal_fraud_known(tx, terminals, known_at))
        rankings[name] = np.where(revealed, 1.0, np.where(y, -1.0, 0.0))
    bounds = {}
    for name, scores in rankings.items():
        _, per_day = metrics.card_precision_per_day(
            days, cards, y, scores, k, exclude_detected=True, divide_by_k=True
        )
        bounds[f"card_precision_at_{k}_{name}"] = float(np.mean(per_day))
    return bounds


_NEVER = np.iinfo(np.int64).min // 2
"""The "previous payment" of a terminal's first payment: nothing is known as of it."""


def _previous_payment(tx: pd.DataFrame, terminals: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """For each (terminal, time), the time of the terminal's latest payment in ``tx`` strictly
    before it (``_NEVER`` for none): the instant of the row the online store serves."""
    payments = tx[["TERMINAL_ID", "TX_TIME_SECONDS"]].astype({"TX_TIME_SECONDS": np.int64})
    payments = payments.rename(columns={"TX_TIME_SECONDS": "previous_at"})
    rows = pd.DataFrame({"row": np.arange(len(at_s)), "TERMINAL_ID": terminals, "at": at_s})
    found = pd.merge_asof(
        rows.sort_values("at"), payments.sort_values("previous_at"), left_on="at",
        right_on="previous_at", by="TERMINAL_ID", direction="backward",
        allow_exact_matches=False,
    ).sort_values("row")  # fmt: skip
    previous = found["previous_at"].to_numpy(dtype=np.float64)
    return np.where(np.isnan(previous), _NEVER, previous).astype(np.int64)


def _terminal_fraud_known(tx: pd.DataFrame, terminals: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """Whether, at each (terminal, time), a fraud at the terminal is labelled (``DELAY_DAYS``
    old) and still inside the longest fraud-rate window."""
    return _terminal_frauds_known(tx, terminals, at_s) > 0


def _terminal_frauds_known(tx: pd.DataFrame, terminals: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """How many frauds at each (terminal, time) are labelled (``DELAY_DAYS`` old) and still
    inside the longest fraud-rate window: those ``terminal_fraud_count_28d`` counts."""
    frauds = tx.loc[tx["TX_FRAUD"] == 1, ["TERMINAL_ID", "TX_TIME_SECONDS"]]
    frauds = frauds.astype({"TX_TIME_SECONDS": np.int64}).rename(
        columns={"TX_TIME_SECONDS": "fraud_at"}
    )
    frauds = frauds.sort_values(["TERMINAL_ID", "fraud_at"], kind="stable")
    frauds["so_far"] = frauds.groupby("TERMINAL_ID").cumcount() + 1
    frauds = frauds.sort_values("fraud_at", kind="stable")
    known_by = at_s - DELAY_DAYS * 86_400
    window_s = int(FRAUD_RATE_WINDOW.total_seconds())

    def so_far(until: np.ndarray) -> np.ndarray:
        """Frauds at the terminal up to ``until`` (inclusive), row by row."""
        rows = pd.DataFrame({"row": np.arange(len(until)), "TERMINAL_ID": terminals, "at": until})
        found = pd.merge_asof(
            rows.sort_values("at"), frauds, left_on="at", right_on="fraud_at",
            by="TERMINAL_ID", direction="backward",
        ).sort_values("row")  # fmt: skip
        return found["so_far"].fillna(0).to_numpy(dtype=np.int64)

    return so_far(known_by) - so_far(known_by - window_s)


def missed_cards(tx: pd.DataFrame, test: pd.DataFrame, k: int = 100) -> dict[str, dict[str, int]]:
    """Where the model's card precision at ``k`` falls short of the ``stored`` ranking: the
    fraudulent cards that ranking reveals, summed over the test days, by what reveals them,
    ``caught`` in the model's top ``k`` of the day or ``missed``. What reveals a card: its
    amount (``amount``: scenarios 1 and 3), else the frauds at its terminal that the store's
    row counts (``terminal_1``: one, ``terminal_2_or_more``). ``test`` holds the scores."""
    y = test["TX_FRAUD"].to_numpy().astype(bool)
    at_s = test["TX_TIME_SECONDS"].to_numpy(dtype=np.int64)
    terminals = test["TERMINAL_ID"].to_numpy()
    known = _terminal_frauds_known(tx, terminals, _previous_payment(tx, terminals, at_s))
    scenario = test["TX_FRAUD_SCENARIO"].to_numpy()
    # Per row: 3 amount, 2 two or more known frauds, 1 one, 0 nothing shows.
    evidence = np.where(
        ~y, 0, np.where(scenario != 2, 3, np.where(known >= 2, 2, np.where(known == 1, 1, 0)))
    )
    day_values, tops = metrics.daily_top_cards(
        test["TX_TIME_DAYS"].to_numpy(), test["CUSTOMER_ID"].to_numpy(), y,
        test["score"].to_numpy(dtype=np.float64), k, exclude_detected=True,
    )  # fmt: skip
    per_card = (
        pd.DataFrame(
            {
                "day": test["TX_TIME_DAYS"].to_numpy(),
                "card": test["CUSTOMER_ID"].to_numpy(),
                "evidence": evidence,
            }
        )
        .groupby(["day", "card"])["evidence"]
        .max()
    )
    names = {3: "amount", 2: "terminal_2_or_more", 1: "terminal_1"}
    out = {kind: dict.fromkeys(names.values(), 0) for kind in ("caught", "missed")}
    detected: set[object] = set()
    for day, (top, fraud) in zip(day_values, tops, strict=True):
        ranked = set(top.tolist())
        today = per_card.loc[day]
        for card, strength in today[today > 0].items():
            if card in detected:
                continue
            out["caught" if card in ranked else "missed"][names[int(strength)]] += 1
        detected |= set(top[fraud].tolist())
    return out


def _fraudmesh(checkout: Path | None = None) -> Path:
    """The ``fraudmesh`` next to this Python, or in ``checkout``'s own ``.venv``."""
    folder = Path(sys.executable).parent if checkout is None else checkout / ".venv" / "bin"
    found = folder / "fraudmesh"
    if not found.is_file():
        raise SystemExit(f"fraudmesh is not installed in {folder} (make install)")
    return found


def _run(argv: list[str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, env=_environment(), check=False
        )
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}); see {log}")
    return round(time.perf_counter() - started, 1)


def _environment() -> dict[str, str]:
    """This environment without ``FRAUD_*`` settings: both versions run their defaults."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FRAUD_")}


def _import(fraudmesh: Path, source: Path, var_dir: Path, log: Path) -> float:
    """``fraudmesh data import`` of the handbook's CSV, as the README documents it."""
    maps = [f"--map={target}={column}" for target, column in MAPPING.items()]
    # A few amounts round to 0.00 in the generator: imported as account verifications.
    argv = [str(fraudmesh), "data", "import", str(source), "--var-dir", str(var_dir), *maps]
    return _run([*argv, "--max-bad-rows", "1000"], log)


def _train(
    fraudmesh: Path, var_dir: Path, work: Path, name: str, train_from: str
) -> tuple[pd.DataFrame, dict[str, object], float]:
    """``fraudmesh train`` on the handbook's periods: its test scores, report and seconds."""
    scores_path = work / f"scores-{name}.parquet"
    report_dir = work / f"report-{name}"
    seconds = _run(
        [
            str(fraudmesh), "train", "--var-dir", str(var_dir),
            "--train-from", train_from, "--train-until", TRAIN_UNTIL,
            "--test-from", TEST_FROM, "--test-until", TEST_UNTIL,
            "--scores-out", str(scores_path), "--report-dir", str(report_dir),
        ],
        work / f"train-{name}.log",
    )  # fmt: skip
    report = json.loads((report_dir / "evaluation.json").read_text())
    return pd.read_parquet(scores_path), report, seconds


def _inputs(var_dir: Path) -> list[str]:
    """The inputs of the version a training run just published (the newest), in order."""
    published = sorted(
        (var_dir / "models").glob("*/*/metadata.json"), key=lambda p: int(p.parent.name)
    )
    return list(json.loads(published[-1].read_text())["feature_order"])


def _figures(tx: pd.DataFrame, scores: pd.DataFrame, report: dict[str, Any]) -> dict[str, Any]:
    """The handbook's figures of one model, and fraudmesh's own on every test row."""
    figures: dict[str, Any] = dict(handbook_metrics(tx, scores))
    model = report["model"]
    figures["all_test_rows"] = {
        "roc_auc": model["roc_auc"],
        "average_precision": model["average_precision"],
        "recall_at_1pct_fpr": model["recall_at_1pct_fpr"],
        "card_precision_at_100": model["card_precision_at_k"],
        "recall_at_review_by_scenario": model["recall_at_review_by_scenario"],
    }
    # The cascade, the small model alone and the rules beside the model, judged against the
    # cascade's quality targets (loadtest/cascade_quality.py).
    figures["side_by_side"] = cascade_quality.figures(report)
    # A version from before the small model (a --before checkout) has no cascade to judge.
    judged = "cascade" in report and "small_model" in report
    figures["cascade_targets"] = [
        {"name": t.name, "value": t.value, "limit": t.limit, "met": t.met}
        for t in (cascade_quality.judge(report) if judged else [])
    ]
    figures["cascade"] = report.get("cascade_summary", {})
    return figures


def run_seed(
    seed: int, work: Path, versions: dict[str, Path], history: bool = False
) -> dict[str, object]:
    """One regeneration: generated, imported and trained by each version, judged alike."""
    started = time.perf_counter()
    tx = generate(seed=seed)
    source = work / f"handbook-{seed}.csv"
    tx.to_csv(source, index=False)
    result: dict[str, Any] = {
        "seed": seed,
        "transactions": len(tx),
        "fraud_share": float(tx["TX_FRAUD"].mean()),
        "seconds": {"generate": round(time.perf_counter() - started, 1)},
        "versions": {},
    }
    print(f"seed {seed}: {len(tx):,} transactions ({tx['TX_FRAUD'].mean():.2%} fraud)")
    periods = [("handbook periods", TRAIN_FROM)]
    periods += [("longer history", HISTORY_FROM)] if history else []
    for version, fraudmesh in versions.items():
        # Each version imports with its own code: its store features are its own.
        var_dir = work / f"var-{version}-{seed}"
        result["seconds"][f"{version}_import"] = _import(
            fraudmesh, source, var_dir, work / f"import-{version}-{seed}.log"
        )
        runs: dict[str, Any] = {}
        for label, train_from in periods:
            name = f"{version}-{seed}-{train_from}"
            scores, report, seconds = _train(fraudmesh, var_dir, work, name, train_from)
            runs[label] = _figures(tx, scores, report) | {
                "train_seconds": seconds,
                "inputs": _inputs(var_dir),
            }
            print(f"seed {seed}, {version}, {label}: {_brief(runs[label])}", flush=True)
        result["versions"][version] = runs
        shutil.rmtree(var_dir, ignore_errors=True)
    source.unlink()
    return result


_MAIN = ("auc_roc", "average_precision", "card_precision_at_100")
"""The handbook's three figures, in its column order."""


def _brief(figures: dict[str, Any]) -> str:
    return " ".join(f"{name} {figures[name]:.4f}" for name in _MAIN)


def summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and standard deviation over the seeds of each version's figures, and of the
    per-seed differences between versions (after − before): the noise a comparison has."""
    out: dict[str, Any] = {}
    versions = list(seeds[0]["versions"]) if seeds else []
    labels = list(seeds[0]["versions"][versions[0]]) if versions else []
    for label in labels:
        per_label: dict[str, Any] = {}
        for version in versions:
            per_label[version] = {
                name: _spread([s["versions"][version][label][name] for s in seeds])
                for name in _MAIN
            }
            found = [s["versions"][version][label].get("missed_cards") for s in seeds]
            if all(f is not None for f in found):
                per_label[version]["missed_cards"] = _totals(found)
        if {"before", "after"} <= set(versions):
            differences = {
                name: _spread(
                    [
                        s["versions"]["after"][label][name] - s["versions"]["before"][label][name]
                        for s in seeds
                    ]
                )
                for name in _MAIN
            }
            per_label["after_minus_before"] = differences
            per_label["verdict"] = {name: verdict(differences[name]) for name in _MAIN}
        out[label] = per_label
    return out


def _totals(found: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """``missed_cards`` summed over seeds."""
    return {
        kind: {key: sum(f[kind][key] for f in found) for key in found[0][kind]} for kind in found[0]
    }


def verdict(difference: dict[str, Any]) -> str:
    """A paired difference over seeds read against its own spread: ``better`` or ``worse``
    only when its mean is further from zero than one standard deviation of the per-seed
    differences, ``within the spread`` otherwise; one seed has no spread to read it against."""
    if difference["n"] < 2:
        return "one seed: no spread"
    if difference["mean"] > difference["sd"]:
        return "better"
    if difference["mean"] < -difference["sd"]:
        return "worse"
    return "within the spread"


def _spread(values: list[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(array.mean()),
        "sd": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
        "min": float(array.min()),
        "max": float(array.max()),
        "n": len(array),
    }


def markdown(results: dict[str, Any]) -> str:
    """The comparison as Markdown: the baselines, each version's mean ± sd over the seeds,
    the paired differences, every seed's figures."""
    lines = [
        f"Regenerated handbook data, seeds {', '.join(str(s['seed']) for s in results['seeds'])};"
        f" test 2018-08-08 → 08-15, handbook protocol. Versions: "
        + ", ".join(f"{v} ({c})" for v, c in results["commits"].items())
        + ".",
        "",
        "| model | AUC ROC | average precision | card precision@100 |",
        "|---|---:|---:|---:|",
    ]
    for name, v in results["baselines"].items():
        lines.append(
            f"| handbook: {name} (published) | {v['auc_roc']:.3f} | {v['average_precision']:.3f} "
            f"| {v['card_precision_at_100']:.3f} |"
        )
    best = results["best_published"]
    lines.append(
        f"| best published figure per column | {best['auc_roc']:.3f} | "
        f"{best['average_precision']:.3f} | {best['card_precision_at_100']:.3f} |"
    )
    for label, per_label in results["summary"].items():
        for version, figures in per_label.items():
            if version == "verdict":
                continue
            cells = " | ".join(
                f"{figures[n]['mean']:+.3f} ± {figures[n]['sd']:.3f}"
                if version == "after_minus_before"
                else f"**{figures[n]['mean']:.3f}** ± {figures[n]['sd']:.3f}"
                for n in _MAIN
            )
            what = "after − before, per seed" if version == "after_minus_before" else version
            lines.append(f"| fraudmesh {what}, {label} (mean ± sd, n={figures['auc_roc']['n']}) "
                         f"| {cells} |")  # fmt: skip
        if "verdict" in per_label:
            cells = " | ".join(per_label["verdict"][n] for n in _MAIN)
            lines.append(
                f"| verdict: the paired difference against its spread, {label} | {cells} |"
            )
    lines += ["", "| seed | version | training | AUC ROC | AP | CP@100 | CP@100 stored | CP@100 reachable | CP@100 ceiling | inputs | train s |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in results["seeds"]:
        for version, runs in s["versions"].items():
            for label, f in runs.items():
                lines.append(
                    f"| {s['seed']} | {version} | {label} | {f['auc_roc']:.4f} | "
                    f"{f['average_precision']:.4f} | {f['card_precision_at_100']:.4f} | "
                    f"{_figure(f.get('card_precision_at_100_stored'))} | "
                    f"{_figure(f.get('card_precision_at_100_reachable'))} | "
                    f"{_figure(f.get('card_precision_at_100_ceiling'))} | "
                    f"{_inputs_cell(f.get('inputs'))} | {f['train_seconds']:.0f} |"
                )
    lines += [
        "",
        f"{BOUNDS_NOTE}; inputs: how many the version took (their names are in the JSON).",
    ]
    lines += _missed_table(results)
    return "\n".join(lines) + "\n"


BOUNDS_NOTE = (
    "CP@100 reachable: first every card with a fraud its amount or a known label reveals "
    "(a terminal's fraud labelled 7 to 35 days before), then the genuine cards; "
    "CP@100 stored: the same with the terminal's labels as of its previous payment (the row "
    "the online store serves); CP@100 ceiling: every fraudulent card first "
    "(`card_precision_bounds`)"
)


def bounds_only(seeds: Sequence[int]) -> dict[str, Any]:
    """The rankings no model can beat (``card_precision_bounds``) of each regeneration, on the
    protocol's test rows; nothing is imported or trained."""
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        tx = generate(seed=seed)
        test = protocol_test_rows(tx, tx)
        bounds = card_precision_bounds(tx, test)
        rows.append({"seed": seed, "test_rows": len(test), **bounds})
        print(f"seed {seed}: {bounds}", flush=True)
    names = [n for n in rows[0] if n.startswith("card_precision")] if rows else []
    spread = {name: _spread([r[name] for r in rows]) for name in names}
    gap = _spread(
        [r["card_precision_at_100_reachable"] - r["card_precision_at_100_stored"] for r in rows]
    )
    return {"seeds": rows, "summary": spread, "reachable_minus_stored": gap}


def bounds_markdown(results: dict[str, Any]) -> str:
    """``bounds_only``'s figures as Markdown."""
    lines = [
        f"Regenerated handbook data, seeds {', '.join(str(r['seed']) for r in results['seeds'])};"
        " test 2018-08-08 → 08-15, handbook protocol; no model.",
        "",
        "| seed | test rows | CP@100 stored | CP@100 reachable | reachable − stored | CP@100 ceiling |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results["seeds"]:
        stored, reachable = r["card_precision_at_100_stored"], r["card_precision_at_100_reachable"]
        lines.append(
            f"| {r['seed']} | {r['test_rows']:,} | {stored:.4f} | {reachable:.4f} | "
            f"{reachable - stored:+.4f} | {r['card_precision_at_100_ceiling']:.4f} |"
        )
    summary, gap = results["summary"], results["reachable_minus_stored"]
    lines.append(
        f"| mean ± sd | | {summary['card_precision_at_100_stored']['mean']:.4f} ± "
        f"{summary['card_precision_at_100_stored']['sd']:.4f} | "
        f"{summary['card_precision_at_100_reachable']['mean']:.4f} ± "
        f"{summary['card_precision_at_100_reachable']['sd']:.4f} | "
        f"{gap['mean']:+.4f} ± {gap['sd']:.4f} | "
        f"{summary['card_precision_at_100_ceiling']['mean']:.4f} ± "
        f"{summary['card_precision_at_100_ceiling']['sd']:.4f} |"
    )
    lines += ["", f"{BOUNDS_NOTE}."]
    return "\n".join(lines) + "\n"


_EVIDENCE = (
    ("amount", "amount"),
    ("terminal_1", "one known fraud at the terminal"),
    ("terminal_2_or_more", "two or more"),
)
"""``missed_cards``' kinds of evidence, in the order and with the words of the table."""


def _missed_table(results: dict[str, Any]) -> list[str]:
    """Per seed, version and training: the cards the ``stored`` ranking reveals, caught by
    the model (in its top 100 of the day) of all, by what reveals them."""
    rows = []
    for s in results["seeds"]:
        for version, runs in s["versions"].items():
            for label, f in runs.items():
                found = f.get("missed_cards")
                if found is None:
                    continue
                rows.append(f"| {s['seed']} | {version} | {label} | {_caught_cells(found)} |")
    if not rows:
        return []
    for label, per_label in results.get("summary", {}).items():
        for version, figures in per_label.items():
            total = figures.get("missed_cards") if isinstance(figures, dict) else None
            if total is None:
                continue
            rows.append(f"| all | {version} | {label} | {_caught_cells(total)} |")
    head = " | ".join(words for _, words in _EVIDENCE)
    return [
        "",
        "Cards the stored ranking reveals, over the test days: caught by the model (in its top "
        "100 of the day) of all, by what reveals them (`missed_cards`).",
        "",
        f"| seed | version | training | {head} |",
        "|---|---|---|---:|---:|---:|",
        *rows,
    ]


def _caught_cells(found: dict[str, dict[str, int]]) -> str:
    """``missed_cards``' figures as table cells: caught of all, per kind of evidence."""
    return " | ".join(
        f"{found['caught'][key]} of {found['caught'][key] + found['missed'][key]}"
        for key, _ in _EVIDENCE
    )


def _inputs_cell(inputs: list[str] | None) -> str:
    """How many inputs a version took (their names are in the JSON)."""
    return "" if inputs is None else str(len(inputs))


def _figure(value: float | None) -> str:
    """A figure of the per-seed table; empty for a run that did not record it."""
    return "" if value is None else f"{value:.4f}"


def _commit(checkout: Path) -> str:
    """The last commit that changed the product's code in ``checkout``."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "log", "-1", "--format=%h", "--", "services"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or "unknown"


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of seeds"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError("give at least one seed")
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and writes ``loadtest/results/external-handbook.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", type=_seeds, default=[0, 1, 2, 3, 4],
        help="regenerations to run (comma-separated generator seeds; default 0,1,2,3,4)",
    )  # fmt: skip
    parser.add_argument(
        "--before", type=Path, default=None,
        help="a checkout of an earlier commit, installed: trained on the same data, side by side",
    )  # fmt: skip
    parser.add_argument(
        "--history", action="store_true",
        help=f"also train on the whole history from {HISTORY_FROM} (as a team with history)",
    )  # fmt: skip
    parser.add_argument(
        "--bounds-only", action="store_true",
        help="only the rankings no model can beat, per seed (seconds; nothing is trained)",
    )  # fmt: skip
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS / "external-handbook")
    args = parser.parse_args(argv)
    if args.bounds_only:
        found = bounds_only(args.seeds)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        provenance.write(args.out, found, bounds_markdown(found), provenance.record())
        print(bounds_markdown(found))
        return 0
    here = Path(__file__).resolve().parents[1]
    versions = {"after": _fraudmesh()}
    commits = {"after": _commit(here)}
    if args.before is not None:
        versions = {"before": _fraudmesh(args.before.resolve()), **versions}
        commits = {"before": _commit(args.before.resolve()), **commits}
    results: dict[str, Any] = {
        "baselines": {name: dict(zip(_MAIN, v, strict=True)) for name, v in BASELINES.items()},
        "best_published": dict(BEST_PUBLISHED),
        "commits": commits,
        "seeds": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fraudmesh-external-", dir=args.work) as tmp:
        for seed in args.seeds:
            results["seeds"].append(run_seed(seed, Path(tmp), versions, args.history))
            results["summary"] = summary(results["seeds"])
            # Written after every seed: a long run that stops keeps the seeds it finished.
            provenance.write(args.out, results, markdown(results), provenance.record())
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
