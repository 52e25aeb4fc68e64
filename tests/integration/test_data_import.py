"""Bring your own data: ``fraudmesh data import``, then training on explicit periods.

A CSV in someone else's column names, with a few broken rows, goes through the real
command: rejected as a whole while the broken rows exceed ``--max-bad-rows`` (exit 2,
nothing changed), imported when they are tolerated, registered with Feast and
materialized; then ``fraudmesh train`` with explicit periods writes the scores of every
test-period transaction and a report with the field's metrics. Importing the simulator's
own transactions gives exactly the feature tables ``make data`` writes.
"""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.domain import featurespec, money
from services.featurestore import layout
from services.featurestore.online import OnlineFeatureReader
from services.featurestore.settings import FeatureStoreSettings
from services.pipelines import dataimport, dataset, simulate

pytestmark = pytest.mark.integration

END = date(2026, 1, 15)  # the small preset: 60 days from 2025-11-16
RENAMED = {
    "transaction_id": "txn_ref",
    "timestamp": "event_time",
    "card_id": "customer_ref",
    "merchant_id": "shop",
    "currency": "ccy",
    "is_fraud": "label",
}
BROKEN = {
    # line in the CSV (header = line 1) → what is wrong with it
    "missing card_id": {"customer_ref": ""},
    "negative amount": {"value": "-5.00"},
    "unknown currency": {"ccy": "XXX"},
    "unparseable timestamp": {"event_time": "yesterday"},
    "is_fraud is not 0/1 or true/false": {"label": "maybe"},
}


@pytest.fixture(scope="module")
def sim() -> simulate.Simulation:
    return simulate.simulate(simulate.preset("small", end=END))


def _their_csv(sim: simulate.Simulation, path: Path) -> dict[str, list[int]]:
    """The simulated history as another team would export it; returns broken lines by reason.

    Amounts in major units, labels as 0/1, timestamps in three styles (ISO with an offset,
    naive ISO meaning UTC, epoch seconds), columns renamed, five broken rows and one
    duplicated transaction id.
    """
    tx = sim.transactions.drop(columns=["customer_id"])
    scale = tx["currency"].map(money.minor_per_major)
    out = pd.DataFrame(
        {
            "txn_ref": tx["transaction_id"],
            "customer_ref": tx["card_id"],
            "shop": tx["merchant_id"],
            "terminal_id": tx["terminal_id"],
            "value": [f"{v:.{round(np.log10(s))}f}" for v, s in zip(tx["amount_minor"] / scale, scale, strict=True)],
            "ccy": tx["currency"],
            "channel": tx["channel"],
            "label": tx["is_fraud"].astype(int).astype(str),
            "card_home_country": tx["card_home_country"],
            "merchant_country": tx["merchant_country"],
            "merchant_category": tx["merchant_category"],
            "fraud_scenario": tx["fraud_scenario"],
        }
    )  # fmt: skip
    seconds = tx["timestamp"].astype("int64") // 10**6
    style = np.arange(len(tx)) % 3
    paris = tx["timestamp"].dt.tz_convert("Europe/Paris")
    out["event_time"] = np.where(
        style == 0,
        paris.dt.strftime("%Y-%m-%dT%H:%M:%S%z"),
        np.where(
            style == 1,
            tx["timestamp"].dt.strftime("%Y-%m-%d %H:%M:%S"),
            seconds.astype(str),
        ),
    )
    broken: dict[str, list[int]] = {}
    rows = [out.iloc[[i]].copy() for i in (100, 200, 300, 400, 500)]
    for (reason, change), row in zip(BROKEN.items(), rows, strict=True):
        for column, value in change.items():
            row[column] = value
        row["txn_ref"] = f"broken-{reason}"
        broken[reason] = [len(out) + 2 + len(broken)]  # appended after the data rows
    duplicate = out.iloc[[1000]].copy()
    out = pd.concat([out, *rows, duplicate], ignore_index=True)
    broken["duplicate transaction_id"] = [len(out) + 1]
    out.to_csv(path, index=False)
    return broken


def _import(var_dir: Path, path: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        [
            "data",
            "import",
            str(path),
            "--var-dir",
            str(var_dir),
            *[f"--map={target}={source}" for target, source in RENAMED.items()],
            "--map=amount=value",
            *extra,
        ],
        catch_exceptions=False,
    )
    return result.exit_code, result.output


def test_import_rejects_broken_rows_then_imports_them_left_out_and_trains_on_periods(
    sim: simulate.Simulation, tmp_path: Path
) -> None:
    var_dir = tmp_path / "var"
    source = tmp_path / "their-history.csv"
    broken = _their_csv(sim, source)
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")

    # A dataset in place already: a rejected import must leave it in use.
    earlier = simulate.simulate(simulate.preset("small", end=END, seed=3))
    dataset.write(dataset.Dataset.from_transactions(earlier.transactions), settings.data_path)
    before = os.readlink(settings.data_path)

    code, output = _import(var_dir, source)
    assert code == dataimport_exit_code(), output
    assert "import rejected" in output and "6 of" in output
    for reason, lines in broken.items():
        assert reason in output, reason
        assert f"line {lines[0]}" in output, (reason, lines)
    assert os.readlink(settings.data_path) == before
    assert not any(
        p.name.startswith(".staging") for p in dataset.versions_dir(settings.data_path).iterdir()
    )

    code, output = _import(var_dir, source, "--max-bad-rows", "6")
    assert code == 0, output
    assert "6 rows left out" in output
    assert os.readlink(settings.data_path) != before
    imported = pd.read_parquet(settings.data_path / layout.TRANSACTIONS_FILE)
    assert len(imported) == len(sim.transactions)
    assert not imported["transaction_id"].str.startswith("broken-").any()
    # Every timestamp style lands on the same instant.
    want = sim.transactions.set_index("transaction_id")["timestamp"]
    got = imported.set_index("transaction_id")["timestamp"]
    assert (got.loc[want.index] == want).all()
    manifest = json.loads((settings.data_path / layout.MANIFEST_FILE).read_text())
    assert manifest["rows"] == len(imported) and manifest["columns"]["card_id"] == "customer_ref"

    # Registered and materialized: the newest card, merchant and terminal rows are online.
    last = imported.iloc[-1]
    reader = OnlineFeatureReader(settings)
    try:
        rows = reader.read(
            last["card_id"], last["merchant_id"], last["timestamp"].timestamp(), last["terminal_id"]
        )
    finally:
        reader.close()
    statuses = {
        name: status for name, (_, status, _) in zip(featurespec.STORE_FEATURES, rows, strict=True)
    }
    assert set(statuses.values()) == {featurespec.FeatureStatus.PRESENT}

    scores_path = tmp_path / "scores.parquet"
    report_dir = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--var-dir", str(var_dir),
            "--train-from", "2025-11-23",
            "--train-until", "2025-12-31",
            "--test-from", "2026-01-07",
            "--test-until", "2026-01-15",
            "--scores-out", str(scores_path),
            "--report-dir", str(report_dir),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    scores = pd.read_parquet(scores_path)
    in_test = imported[
        (imported["timestamp"] >= pd.Timestamp("2026-01-07", tz="UTC"))
        & (imported["timestamp"] < pd.Timestamp("2026-01-15", tz="UTC"))
    ]
    assert len(scores) == len(in_test)
    assert set(scores["transaction_id"]) == set(in_test["transaction_id"])
    assert scores["score"].between(0, 1).all()
    assert scores["is_fraud"].sum() == in_test["is_fraud"].sum() > 0

    report = json.loads((report_dir / "evaluation.json").read_text())
    assert (report_dir / "evaluation.png").stat().st_size > 10_000
    markdown = (report_dir / "evaluation.md").read_text()
    for side in ("model", "rules"):
        figures = report[side]
        for name in ("roc_auc", "average_precision", "recall_at_1pct_fpr", "card_precision_at_k"):
            assert 0.0 <= figures[name] <= 1.0, (side, name)
        for point in ("review", "decline"):
            for name in ("threshold", "precision", "recall", "fpr"):
                assert name in figures[point], (side, point, name)
        assert figures["card_precision_k"] == 100
        assert sorted(figures["card_precision_per_day"]) == [
            f"2026-01-{day:02d}" for day in range(7, 15)
        ]
    assert report["model"]["roc_auc"] > 0.9
    assert report["model"]["average_precision"] > report["rules"]["average_precision"]
    periods = report["periods"]
    assert periods["test"] == ["2026-01-07T00:00:00+00:00", "2026-01-15T00:00:00+00:00"]
    # Validation is carved from the end of the training window, never from the test.
    assert periods["validation"][1] == "2025-12-31T00:00:00+00:00"
    assert periods["train"] == ["2025-11-23T00:00:00+00:00", periods["validation"][0]]
    for label in ("ROC-AUC", "average precision", "recall at 1% FPR", "card precision at 100"):
        assert label in markdown
    assert "rules fallback" in markdown


def dataimport_exit_code() -> int:
    from services.cli.data import REJECTED

    return REJECTED


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_importing_simulated_transactions_gives_the_tables_of_make_data(
    sim: simulate.Simulation, tmp_path: Path, suffix: str
) -> None:
    expected = dataset.write(
        dataset.Dataset.from_transactions(sim.transactions), tmp_path / "simulated"
    )
    source = tmp_path / f"transactions.{suffix}"
    if suffix == "csv":
        sim.transactions.to_csv(source, index=False)
    else:
        sim.transactions.to_parquet(source, index=False)
    options = dataimport.ImportOptions(batch_rows=5_000, batch_bytes=1 << 20)
    result = dataimport.import_transactions(source, tmp_path / "imported", options)
    assert result.rows_imported == len(sim.transactions) and result.bad_rows.total == 0
    for name in layout.FEATURE_FILES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(result.data_dir / name), pd.read_parquet(expected[name]), obj=name
        )
