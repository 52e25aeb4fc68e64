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
card precision at 100 leaves out cards detected on earlier days. A second run trains on
the whole history before the same gap (2018-04-08 → 08-01), as a team with history would.
Each run's training report also puts the cascade, the small model alone and the rules beside
the model on every test payment, judged against the cascade's quality targets
(``loadtest/cascade_quality.py``).

    python -m loadtest.external            # writes loadtest/results/external-handbook.*
    python -m loadtest.external --seed 1 --out loadtest/results/external-handbook-seed1

Published baselines (handbook, section 3.4 "Baseline fraud detection system", test set):
``BASELINES``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from loadtest import cascade_quality
from services.domain import metrics

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


def handbook_metrics(tx: pd.DataFrame, scores: pd.DataFrame, k: int = 100) -> dict[str, float]:
    """AUC ROC, average precision and card precision at ``k`` under the handbook's protocol."""
    scored = tx.merge(
        scores[["transaction_id", "score"]].assign(
            TRANSACTION_ID=scores["transaction_id"].astype(np.int64)
        ),
        on="TRANSACTION_ID",
    )
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
        today = scored[scored["TX_TIME_DAYS"] == day]
        kept.append(today[~today["CUSTOMER_ID"].isin(known)])
    test = pd.concat(kept)
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
    }


def _fraudmesh() -> str:
    found = shutil.which("fraudmesh", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("fraudmesh is not installed next to this Python (make install)")
    return found


def _run(argv: list[str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}); see {log}")
    return round(time.perf_counter() - started, 1)


def run(work: Path, seed: int = 0) -> dict[str, object]:
    """Generates (with ``seed``), imports, trains twice and judges; returns the results."""
    fraudmesh = _fraudmesh()
    started = time.perf_counter()
    tx = generate(seed)
    source = work / "handbook-transactions.csv"
    tx.to_csv(source, index=False)
    generated_s = round(time.perf_counter() - started, 1)
    print(f"generated {len(tx):,} transactions ({tx['TX_FRAUD'].mean():.2%} fraud)")
    var_dir = work / "var"
    maps = [f"--map={target}={column}" for target, column in MAPPING.items()]
    import_s = _run(
        # A few amounts round to 0.00 in the generator: imported as account verifications.
        [
            fraudmesh,
            "data",
            "import",
            str(source),
            "--var-dir",
            str(var_dir),
            *maps,
            "--max-bad-rows",
            "1000",
        ],
        work / "import.log",
    )
    results: dict[str, object] = {
        "seed": seed,
        "transactions": len(tx),
        "fraud_share": float(tx["TX_FRAUD"].mean()),
        "seconds": {"generate": generated_s, "import": import_s},
        "baselines": {
            name: dict(
                zip(("auc_roc", "average_precision", "card_precision_at_100"), v, strict=True)
            )
            for name, v in BASELINES.items()
        },
        "fraudmesh": {},
    }
    for label, train_from in (("handbook periods", TRAIN_FROM), ("longer history", HISTORY_FROM)):
        scores_path = work / f"scores-{train_from}.parquet"
        report_dir = work / f"report-{train_from}"
        seconds = _run(
            [
                fraudmesh, "train", "--var-dir", str(var_dir),
                "--train-from", train_from, "--train-until", TRAIN_UNTIL,
                "--test-from", TEST_FROM, "--test-until", TEST_UNTIL,
                "--scores-out", str(scores_path), "--report-dir", str(report_dir),
            ],
            work / f"train-{train_from}.log",
        )  # fmt: skip
        scores = pd.read_parquet(scores_path)
        figures: dict[str, object] = dict(handbook_metrics(tx, scores))
        ours = json.loads((report_dir / "evaluation.json").read_text())
        figures["train_seconds"] = seconds
        figures["all_test_rows"] = {
            "roc_auc": ours["model"]["roc_auc"],
            "average_precision": ours["model"]["average_precision"],
            "recall_at_1pct_fpr": ours["model"]["recall_at_1pct_fpr"],
            "card_precision_at_100": ours["model"]["card_precision_at_k"],
            "recall_at_review_by_scenario": ours["model"]["recall_at_review_by_scenario"],
        }
        figures["side_by_side"] = cascade_quality.figures(ours)
        figures["cascade_targets"] = [
            {"name": t.name, "value": t.value, "limit": t.limit, "met": t.met}
            for t in cascade_quality.judge(ours)
        ]
        figures["cascade"] = ours.get("cascade_summary", {})
        results["fraudmesh"][label] = figures  # type: ignore[index]
        print(f"{label}: {figures}")
    return results


def markdown(results: dict[str, object]) -> str:
    """The comparison as a Markdown table."""
    lines = [
        "| model (test 2018-08-08 → 08-15, handbook protocol) | AUC ROC | average precision "
        "| card precision@100 |",
        "|---|---:|---:|---:|",
    ]
    baselines = results["baselines"]
    assert isinstance(baselines, dict)
    for name, v in baselines.items():
        lines.append(
            f"| handbook: {name} (published) | {v['auc_roc']:.3f} | {v['average_precision']:.3f} "
            f"| {v['card_precision_at_100']:.3f} |"
        )
    ours = results["fraudmesh"]
    assert isinstance(ours, dict)
    for label, f in ours.items():
        lines.append(
            f"| **fraudmesh, {label}** | **{f['auc_roc']:.3f}** | **{f['average_precision']:.3f}** "
            f"| **{f['card_precision_at_100']:.3f}** |"
        )
    side = {label: f["side_by_side"] for label, f in ours.items() if "side_by_side" in f}
    if side:
        lines += [
            "",
            f"Every test payment (generator seed {results.get('seed', 0)}): the model, the "
            "cascade, the small model alone and the rules, each at its thresholds.",
            "",
            cascade_quality.table(side),
            "",
            cascade_quality.targets_table(
                {
                    label: [cascade_quality.Target(**t) for t in f["cascade_targets"]]
                    for label, f in ours.items()
                }
            ),
            "",
            *[
                cascade_quality.cascade_line(label, {"cascade_summary": f["cascade"]})
                for label, f in ours.items()
            ],
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and writes ``loadtest/results/external-handbook.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS / "external-handbook")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fraudmesh-external-", dir=args.work) as tmp:
        results = run(Path(tmp), args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
