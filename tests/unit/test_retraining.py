"""Retraining from the loop, pure parts: decisions as raw transactions, their labels, the merge
with the history, and the periods ending at the label horizon."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from services.common.errors import FailedPrecondition
from services.domain import aggregation, featurespec
from services.featurestore.settings import FeatureStoreSettings
from services.pipelines import retraining, train
from services.pipelines.retraining import Labelling

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
DELAY = aggregation.LABEL_DELAY


def _at(days_ago: float) -> pd.Timestamp:
    return pd.Timestamp(NOW - timedelta(days=days_ago))


def _decision(tx: str, days_ago: float | None, outcome: str | None = None, **fields: Any) -> dict:
    at = None if days_ago is None else _at(days_ago)
    row = {
        "transaction_id": tx,
        "card_id": "card-000001",
        "merchant_id": "merch-00001",
        "terminal_id": "merch-00001-t1",
        "amount_minor": 1250,
        "currency": "EUR",
        "card_not_present": False,
        "transaction_at": at,
        "decided_at": None if at is None else at + pd.Timedelta(milliseconds=3),
        "outcome": outcome,
        "outcome_reported_at": None if outcome is None or at is None else at + pd.Timedelta(days=2),
        "outcome_received_at": None if outcome is None or at is None else at + pd.Timedelta(days=3),
    }
    return row | fields


def _frame(*rows: dict) -> pd.DataFrame:
    frame = pd.DataFrame(list(rows), columns=list(retraining.DECISION_COLUMNS))
    for name in ("transaction_at", "decided_at", "outcome_reported_at", "outcome_received_at"):
        frame[name] = pd.to_datetime(frame[name], utc=True).astype("datetime64[us, UTC]")
    return frame


def _history(*rows: tuple[str, float, bool]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "transaction_id": [r[0] for r in rows],
            "timestamp": pd.Series([_at(r[1]) for r in rows]).astype("datetime64[us, UTC]"),
            "card_id": "card-000002",
            "merchant_id": "merch-00002",
            "terminal_id": "merch-00002-t1",
            "amount_minor": 990,
            "currency": "GBP",
            "card_home_country": 826,
            "channel": featurespec.CARD_PRESENT,
            "is_fraud": [r[2] for r in rows],
        }
    )


def test_outcomes_label_decisions_and_silence_counts_as_genuine_only_after_the_delay() -> None:
    converted = retraining.decision_transactions(
        _frame(
            _decision("fraud", 10, "fraud"),
            _decision("legit", 10, "legitimate"),
            _decision("disputed", 10, "disputed"),
            _decision("newer-enum", 10, "7"),
            _decision("old", 10),
            _decision("at-the-delay", DELAY.days),
            _decision("young", 1),
            _decision("young-fraud", 1, "fraud"),
        ),
        NOW,
    )
    assert converted.skipped == {}
    tx = converted.transactions.set_index("transaction_id")
    assert tx["label"].to_dict() == {
        "fraud": Labelling.FRAUD,
        "legit": Labelling.LEGITIMATE,
        "disputed": Labelling.DISPUTED,
        "newer-enum": Labelling.DISPUTED,
        "old": Labelling.PRESUMED_GENUINE,
        "at-the-delay": Labelling.PRESUMED_GENUINE,
        "young": Labelling.RECENT,
        "young-fraud": Labelling.FRAUD,
    }
    labels = tx["is_fraud"]
    assert str(labels.dtype) == "boolean"
    assert labels["fraud"] and labels["young-fraud"]
    assert not labels["legit"] and not labels["old"] and not labels["at-the-delay"]
    assert labels[["disputed", "newer-enum", "young"]].isna().all()
    # A fraud is known from its report; other rows fall back to timestamp + delay.
    assert tx.loc["fraud", "fraud_reported_at"] == _at(10) + pd.Timedelta(days=2)
    assert tx["fraud_reported_at"].drop(["fraud", "young-fraud"]).isna().all()
    assert tx.loc["fraud", "fraud_scenario"] == retraining.DECISION_SCENARIO
    assert tx.loc["old", "fraud_scenario"] == retraining.NO_SCENARIO


def test_request_fields_become_the_raw_schema() -> None:
    converted = retraining.decision_transactions(
        _frame(
            _decision("a", 10, card_not_present=True, terminal_id=""),
            _decision("b", 10, card_not_present=None, transaction_at=None),
            _decision("c", 10, "fraud", outcome_reported_at=None),
        ),
        NOW,
    )
    tx = converted.transactions.set_index("transaction_id")
    assert set(aggregation.REQUIRED_COLUMNS) <= {*tx.columns, "transaction_id"}
    assert tx.loc["a", "channel"] == featurespec.CARD_NOT_PRESENT
    assert tx.loc["b", "channel"] == featurespec.CARD_PRESENT
    assert tx.loc["a", "terminal_id"] is None and tx.loc["b", "terminal_id"] == "merch-00001-t1"
    # Without the request's time the decision's stands in.
    assert tx.loc["b", "timestamp"] == _at(10) + pd.Timedelta(milliseconds=3)
    assert tx.loc["c", "fraud_reported_at"] == _at(10) + pd.Timedelta(days=3)
    assert str(tx["timestamp"].dtype) == "datetime64[us, UTC]"
    assert tx["amount_minor"].dtype == "int64"


def test_decisions_no_payment_can_come_from_are_skipped_by_reason() -> None:
    converted = retraining.decision_transactions(
        _frame(
            _decision("ok", 10),
            _decision("no-card", 10, card_id=""),
            _decision("odd-merchant", 10, merchant_id="m\x00"),
            _decision("zzz", 10, currency="ZZZ"),
            _decision("negative", 10, amount_minor=-5),
            _decision("", 10),
            _decision("timeless", None),
        ),
        NOW,
    )
    assert converted.transactions["transaction_id"].tolist() == ["ok"]
    assert converted.skipped == {
        "card_id is required": 1,
        "merchant_id contains non-printable characters": 1,
        "unknown currency": 1,
        "amount_minor missing or negative": 1,
        "no transaction_id": 1,
        "no time": 1,
    }


def test_merge_takes_a_transaction_once_and_an_outcome_relabels_the_history() -> None:
    history = _history(
        ("h-genuine", 20, False),
        ("h-fraud", 19, True),
        ("h-replayed", 18, False),
        ("h-cleared", 17, True),
        ("h-quiet", 16, False),
    )
    converted = retraining.decision_transactions(
        _frame(
            _decision("h-replayed", 18, "fraud"),
            _decision("h-cleared", 17, "legitimate"),
            _decision("h-quiet", 16, "disputed"),
            _decision("h-genuine", 20),
            _decision("new-fraud", 15, "fraud"),
            _decision("new-old", 12),
            _decision("new-young", 1),
        ),
        NOW,
    ).transactions
    before = history.copy(deep=True)
    combined, counts = retraining.merge(history, converted)
    pd.testing.assert_frame_equal(history, before)
    assert combined["transaction_id"].is_unique and len(combined) == 8
    assert combined["timestamp"].is_monotonic_increasing
    tx = combined.set_index("transaction_id")
    assert tx.loc["h-replayed", "is_fraud"] and not tx.loc["h-cleared", "is_fraud"]
    assert not tx.loc["h-quiet", "is_fraud"] and not tx.loc["h-genuine", "is_fraud"]
    assert pd.isna(tx.loc["new-young", "is_fraud"])
    # The history's row is kept (its card, currency and country), not the decision's.
    assert tx.loc["h-replayed", "currency"] == "GBP"
    assert tx.loc["h-replayed", "card_home_country"] == 826
    assert pd.isna(tx.loc["new-old", "card_home_country"])
    assert tx.loc["h-replayed", "fraud_reported_at"] == _at(18) + pd.Timedelta(days=2)
    assert tx["fraud_scenario"].to_dict() == {
        "h-genuine": "none",
        "h-fraud": retraining.HISTORY_SCENARIO,
        "h-replayed": retraining.DECISION_SCENARIO,
        "h-cleared": "none",
        "h-quiet": "none",
        "new-fraud": retraining.DECISION_SCENARIO,
        "new-old": "none",
        "new-young": "none",
    }
    assert counts == {
        "history_rows": 5,
        "decisions_in_history": 4,
        "decision_rows": 3,
        "outcome_frauds": 2,
        "outcome_legitimate": 1,
        "labelled_by_outcome": 3,
        "disputed": 0,
        "presumed_genuine": 1,
        "unlabelled_recent": 1,
        "relabelled_history": 2,
        "rows": 8,
        "frauds": 3,
        "unlabelled_rows": 1,
    }
    assert str(combined["is_fraud"].dtype) == "boolean"
    assert str(combined["card_home_country"].dtype) == "Int64"
    # The merged frame is what the dataset's aggregation reads.
    cards = aggregation.card_feature_table(combined)
    assert len(cards) == 8


def test_a_log_without_outcomes_still_labels_old_decisions_genuine() -> None:
    converted = retraining.decision_transactions(
        _frame(_decision("a", 30), _decision("b", 9), _decision("c", 2)), NOW
    ).transactions
    _, counts = retraining.merge(_history(("h", 40, True)), converted)
    assert counts["labelled_by_outcome"] == 0 and counts["presumed_genuine"] == 2
    assert counts["unlabelled_recent"] == 1 and counts["frauds"] == 1
    notes = retraining._notes({**counts, "outcomes_read": 0}, {}, DELAY)
    assert any("holds no outcome" in note for note in notes)


def test_the_work_folder_never_is_the_serving_one(tmp_path: Path) -> None:
    serving = FeatureStoreSettings(var_dir=tmp_path / "var", store="redis")
    work = retraining.work_settings(serving, tmp_path / "work")
    assert work.store == "sqlite" and work.project == serving.project
    assert work.data_path == tmp_path / "work" / "data"
    assert work.registry_file == tmp_path / "work" / "feast" / "registry.db"
    retraining._check_apart(serving, work)
    with pytest.raises(FailedPrecondition, match="serving dataset"):
        retraining._check_apart(serving, retraining.work_settings(serving, tmp_path / "var"))
    explicit = FeatureStoreSettings(var_dir=tmp_path / "var", data_dir=tmp_path / "w" / "data")
    with pytest.raises(FailedPrecondition, match="serving dataset"):
        retraining._check_apart(explicit, retraining.work_settings(explicit, tmp_path / "w"))


def test_work_lock_refuses_a_second_run(tmp_path: Path) -> None:
    held = retraining.work_lock(tmp_path)
    with held, pytest.raises(FailedPrecondition, match="another"), retraining.work_lock(tmp_path):
        pass
    with retraining.work_lock(tmp_path):
        pass


def test_default_periods_end_on_the_label_horizons_day() -> None:
    stamps = pd.Series(pd.date_range("2026-09-01", "2026-11-23 10:00", freq="h", tz=UTC))
    params = train.TrainParams()
    plain = train._window(stamps, params, train.Periods())
    assert plain.end == datetime(2026, 11, 24, tzinfo=UTC)
    horizon = NOW - DELAY
    capped = train._window(stamps, params, train.Periods(), horizon)
    assert capped.end == datetime(2026, 11, 16, tzinfo=UTC)
    assert capped.holdout_start < capped.end
    # Explicit periods win; the report then says the test period reaches past the horizon.
    explicit = train.Periods(test_until=datetime(2026, 11, 23, tzinfo=UTC))
    beyond = train._window(stamps, params, explicit, horizon)
    assert beyond.end == datetime(2026, 11, 23, tzinfo=UTC)
    notes = train._notes(beyond, stamps.min(), params, horizon, {"test": 4})
    assert any("label horizon" in n for n in notes)
    assert any("4 payment(s) in the test window have no label" in n for n in notes)
