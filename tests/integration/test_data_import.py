"""Bring your own data: ``fraudmesh data import``, then training on explicit periods.

A CSV in someone else's column names, with a few broken rows, goes through the real
command: rejected as a whole while the broken rows exceed ``--max-bad-rows`` (exit 2,
nothing changed), imported when they are tolerated, registered with Feast and
materialized; then ``fraudmesh train`` with explicit periods writes the scores of every
test-period transaction and a report with the field's metrics. Importing the simulator's
own transactions gives exactly the feature tables ``make data`` writes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
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
    # A terminal's fraud times are those of known frauds while its 28-day fraud rate counts
    # one, and none (a value) while it counts none.
    values = {
        name: value for name, (value, _, _) in zip(featurespec.STORE_FEATURES, rows, strict=True)
    }
    counted = values["terminal_fraud_rate_28d"] > 0
    assert (values["terminal_known_fraud_first_s"] > featurespec.NO_KNOWN_FRAUD) == counted

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


# --- bad files and bad options through the command: exit 2, one line, nothing changed -------

GOOD_HEADER = "transaction_id,timestamp,card_id,merchant_id,amount,currency,is_fraud\n"
GOOD_ROWS = "".join(
    f"g{i},2026-01-01T00:{i % 60:02d}:00Z,c{i % 4},m{i % 2},{i}.25,EUR,{int(i % 9 == 0)}\n"
    for i in range(200)
)
GOOD = (GOOD_HEADER + GOOD_ROWS).encode()


def _good_parquet() -> bytes:
    out = io.BytesIO()
    pd.read_csv(io.BytesIO(GOOD)).to_parquet(out, index=False)
    return out.getvalue()


# name → (file name, content, extra options, what stderr's one line says)
BAD_FILES: dict[str, tuple[str, bytes, tuple[str, ...], str]] = {
    "empty file": ("tx.csv", b"", (), "is empty (0 bytes)"),
    "header only": ("tx.csv", GOOD_HEADER.encode(), (), "holds column names but no rows"),
    "not UTF-8": ("tx.csv", GOOD + "x,2026-01-01,caf\xe9,m,1,EUR,0\n".encode("latin-1"), (), "line 202: not UTF-8 text"),
    "truncated Parquet": ("tx.parquet", _good_parquet()[:700], (), "lacks the Parquet footer"),
    "truncated gzip": ("tx.csv.gz", gzip.compress(GOOD)[:300], (), "its gzip data is truncated"),
    "gzip CSV, a bad row": ("tx.csv.gz", gzip.compress(GOOD + b"bad,2026-01-01,c,m,-1,EUR,0\n"), (), "1 of 201 rows"),
    "unknown extension": ("tx.json", GOOD, (), "cannot tell the format"),
    "semicolons": ("tx.csv", GOOD.replace(b",", b";"), (), "split by semicolons"),
    "repeated column": ("tx.csv", GOOD.replace(b"currency,", b"card_id,", 1), (), "more than one column named 'card_id'"),
    "--map names a missing column": ("tx.csv", GOOD, ("--map", "card_id=customer_ref"), "--map names column(s) 'customer_ref'"),
    "--map without =": ("tx.csv", GOOD, ("--map", "card_id"), "expected TARGET=SOURCE"),
    "--format parquet on CSV": ("tx.csv", GOOD, ("--format", "parquet"), "is not a Parquet file"),
}  # fmt: skip

BAD_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "negative --max-bad-rows": (("--max-bad-rows", "-1"), "--max-bad-rows"),
    "--max-bad-rows not a number": (("--max-bad-rows", "many"), "--max-bad-rows"),
    "NaN --label-delay-days": (("--label-delay-days", "nan"), "--label-delay-days"),
    "huge --label-delay-days": (("--label-delay-days", "1e12"), "--label-delay-days"),
    "unknown --format": (("--format", "xlsx"), "--format"),
}


@pytest.fixture
def imported(tmp_path: Path) -> Path:
    """A state folder holding a small imported dataset: what a rejected import leaves alone."""
    var_dir = tmp_path / "var"
    good = tmp_path / "good.csv"
    good.write_bytes(GOOD)
    code, _, err = _cli("data", "import", str(good), "--var-dir", str(var_dir), "--no-materialize")
    assert code == 0, err
    return var_dir


def _cli(*args: str) -> tuple[int, str, str]:
    """Runs ``fraudmesh ARGS`` in this process; any exception escaping the command fails."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every path under ``root`` with what identifies its content."""
    out: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = ("link", os.readlink(path))
        elif path.is_file():
            out[key] = ("file", path.stat().st_size, path.stat().st_mtime_ns)
        else:
            out[key] = ("folder",)
    return out


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_exits_2_with_one_line_naming_it_and_changes_nothing(
    imported: Path, tmp_path: Path, case: str
) -> None:
    name, content, extra, expected = BAD_FILES[case]
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(content)
    before = _tree(imported)
    code, out, err = _cli("data", "import", str(path), "--var-dir", str(imported), *extra)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import rejected: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert _tree(imported) == before


def test_paths_that_are_not_files_exit_2_naming_them(imported: Path, tmp_path: Path) -> None:
    folder = tmp_path / "history.csv"
    folder.mkdir()
    missing = tmp_path / "nope.csv"
    before = _tree(imported)
    for path, says in ((folder, "is a directory, not a file"), (missing, "does not exist")):
        code, out, err = _cli("data", "import", str(path), "--var-dir", str(imported))
        assert code == 2 and err.strip() == f"import rejected: {path} {says}", (out, err)
    assert _tree(imported) == before


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_a_bad_option_exits_2_naming_it_and_changes_nothing(
    imported: Path, tmp_path: Path, case: str
) -> None:
    options, named = BAD_OPTIONS[case]
    path = tmp_path / "tx.csv"
    path.write_bytes(GOOD)
    before = _tree(imported)
    code, out, err = _cli("data", "import", str(path), "--var-dir", str(imported), *options)
    assert code == 2, (out, err)
    assert named in err and "Traceback" not in out + err
    assert _tree(imported) == before


def test_the_installed_command_rejects_the_held_out_kinds_of_file(
    imported: Path, tmp_path: Path
) -> None:
    """The console script itself (no test runner around it): exit 2, one line, no trace."""
    fraudmesh = Path(sys.executable).parent / "fraudmesh"
    before = _tree(imported)
    for case in ("empty file", "not UTF-8", "truncated Parquet", "truncated gzip"):
        name, content, _, expected = BAD_FILES[case]
        path = tmp_path / case.replace(" ", "-") / name
        path.parent.mkdir()
        path.write_bytes(content)
        ran = subprocess.run(
            [str(fraudmesh), "data", "import", str(path), "--var-dir", str(imported)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 2, (case, ran.stdout, ran.stderr)
        lines = ran.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"import rejected: {path}"), ran.stderr
        assert expected in lines[0] and "Traceback" not in ran.stdout + ran.stderr
    assert _tree(imported) == before


def test_zero_amounts_are_imported_as_account_verifications(tmp_path: Path) -> None:
    path = tmp_path / "tx.csv"
    verifications = (
        b"v1,2026-01-01T02:00:00Z,c1,m1,0.00,EUR,0\nv2,2026-01-01T02:01:00Z,c1,m1,0,JPY,1\n"
    )
    path.write_bytes(GOOD + verifications)
    var_dir = tmp_path / "var"
    code, out, err = _cli(
        "data", "import", str(path), "--var-dir", str(var_dir), "--no-materialize"
    )
    assert code == 0 and "imported 202 of 202 rows" in out, (out, err)
    data_path = FeatureStoreSettings(var_dir=var_dir, store="sqlite").data_path
    tx = pd.read_parquet(data_path / layout.TRANSACTIONS_FILE).set_index("transaction_id")
    assert tx.loc[["v1", "v2"], "amount_minor"].tolist() == [0, 0]
    cards = pd.read_parquet(data_path / layout.CARD_FEATURES_FILE)
    last = cards[cards["card_id"] == "c1"].iloc[-1]
    # Two payments of nothing in the last hour: card testing's signature, counted as small.
    assert last["card_txn_count_1h"] == 2 and last["card_small_txn_count_1h"] == 2
    assert last["card_amount_max_7d"] > 0.0  # the earlier payments of the week still count
