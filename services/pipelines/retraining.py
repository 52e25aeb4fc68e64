"""Retraining from the loop: decisions joined with their outcomes, merged with the history into
a training dataset of its own, then trained like any dataset.

Each decision the mesh answered is a payment. Its request fields become a raw transaction
(``aggregation.RAW_COLUMNS``): ``transaction_at`` is the timestamp (``decided_at`` when it is
missing), ``card_not_present`` the channel, an empty terminal no terminal. Its label comes from
the transaction's latest outcome (``pipelines.decisions.joined``):

======================================  =========  ==========================================
latest outcome                          label      why
======================================  =========  ==========================================
fraud                                   fraud      reported (chargeback, analyst, …); known
                                                   from the outcome's ``reported_at``
legitimate                              genuine    confirmed
disputed (or a value this build does    none       contested and not settled: either label
not know)                                          would be a guess
none, payment older than the label      genuine    fraud surfaces within the delay (that is
delay                                              how chargebacks arrive), as in the history
none, payment younger than the delay    none       its chargeback may still come
======================================  =========  ==========================================

How unlabelled payments count, how a transaction in both the history and the log is taken
once, and where the dataset is built (its own folder and Feast registry; the serving ones are
only read): ``docs/lifecycle.md``, "Retraining from the loop".
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from services.common import filecommit
from services.common.errors import FailedPrecondition
from services.decisionlog import layout as log_layout
from services.domain import aggregation, featurespec, money
from services.domain.validation import id_problem
from services.featurestore import admin, layout
from services.featurestore.settings import FeatureStoreSettings
from services.models import gates as promotion_gates
from services.pipelines import dataset, decisions, train

DECISION_SCENARIO = "decision_log"
"""``fraud_scenario`` of a fraud known from a reported outcome."""
HISTORY_SCENARIO = "history"
"""``fraud_scenario`` of a history fraud when the history names no scenario."""
NO_SCENARIO = "none"
"""``fraud_scenario`` of a genuine or unlabelled payment (the simulator's word)."""
PUBLISHED_BY = "fraudmesh train --from-decisions"
"""Who publishes the version, in the lifecycle's audit trail."""
WORK_LOCK = ".lock"
"""File in the work folder that one run at a time holds."""

DECISION_COLUMNS = (
    "transaction_id",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount_minor",
    "currency",
    "card_not_present",
    "transaction_at",
    "decided_at",
    "outcome",
    "outcome_reported_at",
    "outcome_received_at",
)
"""The columns of the joined decision log that conversion reads."""

_CODES = ("card_home_country", "merchant_country", "merchant_category")
_TIME = "datetime64[us, UTC]"
_HISTORY_COLUMNS = (*aggregation.RAW_COLUMNS, "fraud_scenario")

Progress = Callable[[str, int, int], None]
"""Called with (step, done, total), as training's progress."""


class Labelling(enum.StrEnum):
    """How a decision was labelled (see the module's table)."""

    FRAUD = "outcome_fraud"
    LEGITIMATE = "outcome_legitimate"
    DISPUTED = "disputed"
    PRESUMED_GENUINE = "presumed_genuine"
    RECENT = "recent"
    """No outcome yet and younger than the label delay."""


class DecisionLogMissing(FailedPrecondition):
    """There is no decision log to train from; the message says what to run."""


@dataclass(frozen=True)
class Converted:
    """Decisions as raw transactions, each with how it was labelled, and what was skipped."""

    transactions: pd.DataFrame
    """``aggregation.RAW_COLUMNS`` (``is_fraud`` nullable), ``fraud_scenario``, ``label``."""
    skipped: dict[str, int]
    """Decisions left out, by reason (fields a payment needs are missing or invalid)."""


def decision_transactions(
    decided: pd.DataFrame, now: datetime, label_delay: timedelta = aggregation.LABEL_DELAY
) -> Converted:
    """Decisions (``DECISION_COLUMNS`` of ``decisions.joined``, one per transaction) as raw
    transactions labelled as the module says, as of ``now``."""
    n = len(decided)
    when = _times(decided["transaction_at"])
    when = when.where(when.notna(), _times(decided["decided_at"]))
    ids = _text(decided["transaction_id"])
    cards = _text(decided["card_id"])
    merchants = _text(decided["merchant_id"])
    terminals = _text(decided["terminal_id"])
    currency = _text(decided["currency"])
    amount = pd.to_numeric(decided["amount_minor"], errors="coerce")
    reason = _skip_reasons(n, ids, cards, merchants, terminals, currency, amount, when)
    keep = pd.isna(reason)
    skipped = pd.Series(reason[~keep]).value_counts().to_dict()

    outcome = decided["outcome"].astype(object).where(decided["outcome"].notna(), None)
    outcome = outcome.to_numpy()[keep]
    at = when[keep].reset_index(drop=True)
    label = labellings(outcome, at, now, label_delay)
    unknown = np.isin(label, [Labelling.DISPUTED.value, Labelling.RECENT.value])
    is_fraud = pd.arrays.BooleanArray(label == Labelling.FRAUD.value, unknown)
    reported = _times(decided["outcome_reported_at"])[keep].reset_index(drop=True)
    received = _times(decided["outcome_received_at"])[keep].reset_index(drop=True)
    reported = reported.where(reported.notna(), received)
    fraud = label == Labelling.FRAUD.value
    frame = pd.DataFrame(
        {
            "transaction_id": ids[keep].to_numpy(dtype=object),
            "timestamp": at,
            "card_id": cards[keep].to_numpy(dtype=object),
            "merchant_id": merchants[keep].to_numpy(dtype=object),
            "terminal_id": terminals[keep].replace("", None).to_numpy(dtype=object),
            "amount_minor": amount[keep].to_numpy(dtype=np.int64),
            "currency": currency[keep].to_numpy(dtype=object),
            "channel": np.where(
                decided["card_not_present"]
                .astype("boolean")
                .fillna(False)
                .to_numpy(dtype=bool)[keep],
                featurespec.CARD_NOT_PRESENT,
                featurespec.CARD_PRESENT,
            ).astype(object),
            "is_fraud": is_fraud,
            "fraud_reported_at": reported.where(pd.Series(fraud), pd.NaT).astype(_TIME),
            "fraud_scenario": np.where(fraud, DECISION_SCENARIO, NO_SCENARIO).astype(object),
            "label": label,
        }
    )
    return Converted(frame, {str(k): int(v) for k, v in skipped.items()})


def labellings(
    outcomes: np.ndarray, at: pd.Series, now: datetime, label_delay: timedelta
) -> np.ndarray:
    """How each decision is labelled (``Labelling`` values) from its latest outcome (None for
    none) and its time ``at``, as of ``now`` (the table in the module's docstring)."""
    old = (at <= pd.Timestamp(now).tz_convert(UTC) - label_delay).to_numpy()
    return np.select(
        [outcomes == "fraud", outcomes == "legitimate", pd.notna(outcomes), old],
        [
            Labelling.FRAUD.value,
            Labelling.LEGITIMATE.value,
            Labelling.DISPUTED.value,
            Labelling.PRESUMED_GENUINE.value,
        ],
        Labelling.RECENT.value,
    ).astype(object)


def _skip_reasons(
    n: int,
    ids: pd.Series,
    cards: pd.Series,
    merchants: pd.Series,
    terminals: pd.Series,
    currency: pd.Series,
    amount: pd.Series,
    when: pd.Series,
) -> np.ndarray:
    """Per decision: why no payment can come from it (the first reason found), or None."""
    reason = np.full(n, None, dtype=object)

    def flag(bad: np.ndarray, why: str) -> None:
        reason[bad & pd.isna(reason)] = why

    flag((ids == "").to_numpy(), "no transaction_id")
    for name, values, required in (
        ("card_id", cards, True),
        ("merchant_id", merchants, True),
        ("terminal_id", terminals, False),
    ):
        found = {v: id_problem(v, required) for v in values.unique()}
        problems = values.map(found)
        for problem in problems.dropna().unique():
            flag((problems == problem).to_numpy(), f"{name} {problem}")
    flag((amount.isna() | (amount < 0)).to_numpy(), "amount_minor missing or negative")
    known = {c: money.is_known(c) for c in currency.unique()}
    flag(~currency.map(known).to_numpy(dtype=bool), "unknown currency")
    flag(when.isna().to_numpy(), "no time")
    return reason


def merge(history: pd.DataFrame, converted: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The history and the converted decisions as one transaction frame, sorted by time, a
    transaction in both taken once (the history's row, relabelled by a fraud or legitimate
    outcome); and the counts by origin and label. Outcome counts cover every decision;
    ``presumed_genuine``, ``disputed`` and ``unlabelled_recent`` the added ones only (a
    payment of the history keeps its label unless an outcome settles it)."""
    # New arrays for the columns written below, so that the caller's frame stays as it was
    # without copying the whole history.
    history = history.reset_index(drop=True)
    history["is_fraud"] = history["is_fraud"].astype("boolean", copy=True)
    if "fraud_scenario" in history.columns:
        history["fraud_scenario"] = history["fraud_scenario"].to_numpy(dtype=object, copy=True)
    else:
        history["fraud_scenario"] = np.where(
            history["is_fraud"].fillna(False), HISTORY_SCENARIO, NO_SCENARIO
        ).astype(object)
    if "fraud_reported_at" in history.columns:
        history["fraud_reported_at"] = history["fraud_reported_at"].astype(_TIME, copy=True)
    else:
        history["fraud_reported_at"] = pd.Series(pd.NaT, index=history.index, dtype=_TIME)
    labels = converted["label"]
    in_history = converted["transaction_id"].isin(history["transaction_id"]).to_numpy()
    definitive = labels.isin([Labelling.FRAUD.value, Labelling.LEGITIMATE.value]).to_numpy()
    reported = converted.loc[in_history & definitive].set_index("transaction_id")
    relabelled = 0
    if len(reported):
        rows = history["transaction_id"].isin(reported.index).to_numpy()
        ids = history.loc[rows, "transaction_id"].to_numpy(dtype=object)
        new = reported["is_fraud"].reindex(ids).to_numpy(dtype=bool)
        old = history.loc[rows, "is_fraud"].to_numpy(dtype=object)
        relabelled = int(sum(o is pd.NA or bool(o) != v for o, v in zip(old, new, strict=True)))
        history.loc[rows, "is_fraud"] = new
        history.loc[rows, "fraud_reported_at"] = (
            reported["fraud_reported_at"].reindex(ids).to_numpy()
        )
        scenario = history.loc[rows, "fraud_scenario"].to_numpy(dtype=object)
        was_fraud = np.array([o is not pd.NA and bool(o) for o in old])
        history.loc[rows, "fraud_scenario"] = np.where(
            new, np.where(was_fraud, scenario, DECISION_SCENARIO), NO_SCENARIO
        )
    added = converted.loc[~in_history].drop(columns="label")
    combined = pd.concat([history, added], ignore_index=True)
    combined["is_fraud"] = combined["is_fraud"].astype("boolean")
    combined["fraud_reported_at"] = combined["fraud_reported_at"].astype(_TIME)
    combined["timestamp"] = combined["timestamp"].astype(_TIME)
    for code in _CODES:
        if code in combined.columns:
            combined[code] = combined[code].astype("Int64")
    if "terminal_id" in combined.columns:
        combined["terminal_id"] = combined["terminal_id"].astype(object)
    order = np.lexsort(
        (
            combined["transaction_id"].to_numpy(dtype=object),
            aggregation.timestamps_us(combined["timestamp"]),
        )
    )
    combined = combined.iloc[order].reset_index(drop=True)
    by_label = labels.value_counts()
    # Payments of the history keep its label unless an outcome settled them: only the added
    # ones are presumed genuine or left without a label.
    added_by_label = labels[~in_history].value_counts()
    counts = {
        "history_rows": len(history),
        "decisions_in_history": int(in_history.sum()),
        "decision_rows": len(added),
        "outcome_frauds": int(by_label.get(Labelling.FRAUD.value, 0)),
        "outcome_legitimate": int(by_label.get(Labelling.LEGITIMATE.value, 0)),
        "labelled_by_outcome": int(definitive.sum()),
        "disputed": int(added_by_label.get(Labelling.DISPUTED.value, 0)),
        "presumed_genuine": int(added_by_label.get(Labelling.PRESUMED_GENUINE.value, 0)),
        "unlabelled_recent": int(added_by_label.get(Labelling.RECENT.value, 0)),
        "relabelled_history": relabelled,
        "rows": len(combined),
        "frauds": int(combined["is_fraud"].fillna(False).sum()),
        "unlabelled_rows": int(combined["is_fraud"].isna().sum()),
    }
    return combined, counts


def default_work_dir(var_dir: Path) -> Path:
    """Where the training dataset is built by default: ``<var>/training/from-decisions``."""
    return var_dir / "training" / "from-decisions"


def work_settings(settings: FeatureStoreSettings, work_dir: Path) -> FeatureStoreSettings:
    """The store settings of the training dataset: its own data folder, registry and SQLite
    file under ``work_dir`` (training reads no online store, so never Redis)."""
    # A copy, not new settings from the environment: FRAUD_FEATURES_DATA_DIR and friends
    # name the serving paths and must not leak into the work folder's.
    return settings.model_copy(
        update={
            "var_dir": work_dir,
            "store": "sqlite",
            "data_dir": None,
            "registry_path": None,
            "online_path": None,
        }
    )


@dataclass(frozen=True)
class TrainingData:
    """The training dataset built from the history and the decision log."""

    settings: FeatureStoreSettings
    """The store settings that point at it (``work_settings``)."""
    source: train.DataSource
    """Its counts, label horizon and notes, for the published version."""
    summary: decisions.ExportSummary
    """What reading the decision log found."""


def build(
    settings: FeatureStoreSettings,
    decisions_root: Path,
    work_dir: Path,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
    label_delay: timedelta = aggregation.LABEL_DELAY,
    progress: Progress | None = None,
) -> TrainingData:
    """Reads the serving dataset's transactions and the decision log (decisions with
    ``since <= decided_at < until``), and publishes their merge, with its feature tables and
    a Feast registry, under ``work_dir``. Hold ``work_lock(work_dir)`` around it and the
    training that reads it."""
    report = progress or (lambda step, done, total: None)
    now = now or datetime.now(UTC)
    target = work_settings(settings, work_dir)
    _check_sources(settings, target, decisions_root)
    history_dir = settings.data_path
    report("decisions", 0, 1)
    combined, counts, skipped, summary = _read_and_merge(
        history_dir, decisions_root, since, until, now, label_delay
    )
    report("decisions", 1, 1)

    horizon = now - label_delay

    def manifest() -> dict[str, object]:
        return {
            "source": "history + decision log",
            "history": str(history_dir.resolve()),
            "decision_log": str(decisions_root.resolve()),
            "decisions_since": since.isoformat() if since else None,
            "decisions_until": until.isoformat() if until else None,
            "label_delay_days": label_delay / timedelta(days=1),
            "label_horizon": horizon.isoformat(),
            "built_at": now.isoformat(),
            "counts": counts,
            "skipped": skipped,
        }

    _publish_dataset(target, combined, label_delay, manifest, report)
    del combined
    report("apply", 0, 1)
    admin.apply(target)
    report("apply", 1, 1)
    return TrainingData(
        target,
        train.DataSource(
            counts=counts,
            label_horizon=horizon,
            published_by=PUBLISHED_BY,
            notes=tuple(_notes(counts, skipped, label_delay)),
        ),
        summary,
    )


def _check_sources(
    settings: FeatureStoreSettings, target: FeatureStoreSettings, decisions_root: Path
) -> None:
    """Refuses a work folder on the serving paths, a missing history or decision log."""
    _check_apart(settings, target)
    history_dir = settings.data_path
    if not layout.data_present(history_dir):
        raise train.TrainingDataError(
            f"no dataset in {history_dir}: run `fraudmesh features simulate` or "
            "`fraudmesh data import` (retraining adds the decision log to a history)"
        )
    if not any(log_layout.parts(d) for _, d in log_layout.day_dirs(decisions_root, "decisions")):
        raise DecisionLogMissing(
            f"no decision log in {decisions_root}: run the mesh (`fraudmesh up`), whose "
            "decision sink writes one, or name the log's folder with --decisions-root"
        )


def _read_and_merge(
    history_dir: Path,
    decisions_root: Path,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
    label_delay: timedelta,
) -> tuple[pd.DataFrame, dict[str, int], dict[str, int], decisions.ExportSummary]:
    """The history merged with the converted decisions; the counts, the decisions skipped by
    reason, and what reading the log found."""
    joined, summary = decisions.joined(decisions_root, since, until)
    if joined.num_rows == 0:
        raise DecisionLogMissing(
            f"the decision log in {decisions_root} holds no decision"
            + _window_text(since, until)
            + ": widen --decisions-since/--decisions-until or let the mesh run longer"
        )
    converted = decision_transactions(
        joined.select(list(DECISION_COLUMNS)).to_pandas(), now, label_delay
    )
    del joined
    # Read the version the link names now: a swap meanwhile does not mix two datasets.
    history = _read_history(history_dir.resolve())
    combined, counts = merge(history, converted.transactions)
    del history
    counts = {
        "outcomes_read": summary.outcomes,
        "decisions": summary.decisions,
        "decisions_skipped": sum(converted.skipped.values()),
        **counts,
    }
    return combined, counts, converted.skipped, summary


def _publish_dataset(
    target: FeatureStoreSettings,
    combined: pd.DataFrame,
    label_delay: timedelta,
    manifest: Callable[[], dict[str, object]],
    report: Progress,
) -> None:
    """Publishes the merged transactions, their feature tables and the manifest (made once
    they are written) atomically."""
    with dataset.staging(target.data_path) as folder:
        dataset.write_table(
            pa.Table.from_pandas(combined, preserve_index=False),
            folder / layout.TRANSACTIONS_FILE,
        )
        dataset.write_feature_tables(
            combined,
            folder,
            label_delay,
            progress=lambda done, total: report("dataset", done, total),
        )
        (folder / layout.MANIFEST_FILE).write_text(json.dumps(manifest(), indent=2))


@contextlib.contextmanager
def work_lock(work_dir: Path) -> Iterator[None]:
    """Holds the work folder for one run; another run fails at once instead of sharing it."""
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = filecommit.hold_lock(work_dir / WORK_LOCK, wait=False)
    except BlockingIOError as error:
        raise FailedPrecondition(
            f"another `fraudmesh train --from-decisions` is using {work_dir}: wait for it "
            "or give this one its own --work-dir"
        ) from error
    try:
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RetrainResult:
    """The training run and the dataset it ran on."""

    training: train.TrainResult
    data: TrainingData
    seconds_to_build: float


def train_from_decisions(
    settings: FeatureStoreSettings,
    model_root: Path,
    decisions_root: Path,
    work_dir: Path | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    params: train.TrainParams | None = None,
    progress: Progress | None = None,
    periods: train.Periods | None = None,
    promote: bool = False,
    gate_policy: promotion_gates.GatePolicy | None = None,
    now: datetime | None = None,
) -> RetrainResult:
    """Builds the training dataset (``build``) and trains on it exactly as ``train.train``
    does: same periods, evaluation, gates; publishes a candidate (live with ``promote`` and
    passed gates)."""
    work = work_dir or default_work_dir(settings.var_dir)
    _check_apart(settings, work_settings(settings, work))
    with work_lock(work):
        started = time.perf_counter()
        data = build(settings, decisions_root, work, since, until, now, progress=progress)
        built = time.perf_counter() - started
        result = train.train(
            data.settings,
            model_root,
            params,
            progress=progress,
            periods=periods,
            promote=promote,
            gate_policy=gate_policy,
            source=data.source,
        )
    return RetrainResult(result, data, round(built, 3))


def _read_history(data_dir: Path) -> pd.DataFrame:
    path = data_dir / layout.TRANSACTIONS_FILE
    available = pq.ParquetFile(path).schema_arrow.names
    return pd.read_parquet(path, columns=[c for c in _HISTORY_COLUMNS if c in available])


def _check_apart(serving: FeatureStoreSettings, work: FeatureStoreSettings) -> None:
    """Refuses a work folder whose dataset or registry would be the serving one's."""
    pairs = (
        ("dataset", serving.data_path, work.data_path),
        ("Feast registry", serving.registry_file, work.registry_file),
        ("online store", serving.online_file, work.online_file),
    )
    for what, theirs, ours in pairs:
        if theirs.resolve() == ours.resolve():
            raise FailedPrecondition(
                f"the work folder {work.var_dir} would replace the serving {what} ({theirs}): "
                "give another --work-dir"
            )


def _times(values: pd.Series) -> pd.Series:
    return pd.to_datetime(values, utc=True).astype(_TIME).reset_index(drop=True)


def _text(values: pd.Series) -> pd.Series:
    return values.astype(object).where(values.notna(), "").astype(str).reset_index(drop=True)


def _window_text(since: datetime | None, until: datetime | None) -> str:
    if since is None and until is None:
        return ""
    start = since.isoformat() if since else "the start"
    end = until.isoformat() if until else "the end"
    return f" decided between {start} and {end}"


def _notes(counts: dict[str, int], skipped: dict[str, int], delay: timedelta) -> list[str]:
    """Caveats about the decision log's part of the data, for the report."""
    notes = [
        f"{counts['decision_rows']:,} payment(s) from the decision log added to "
        f"{counts['history_rows']:,} from the history ({counts['decisions_in_history']:,} "
        f"already there taken once); {counts['labelled_by_outcome']:,} labelled by a "
        f"reported outcome ({counts['outcome_frauds']:,} fraud), "
        f"{counts['presumed_genuine']:,} genuine for lack of an outcome after "
        f"{delay.days} days, {counts['unlabelled_recent']:,} recent and "
        f"{counts['disputed']:,} disputed without a label yet."
    ]
    if counts["outcomes_read"] == 0:
        notes.append(
            "The decision log holds no outcome: its payments older than the label delay count "
            "as genuine, so its frauds are missed. Report outcomes "
            "(fraud.v1.OutcomeService/ReportOutcome) to label them."
        )
    if skipped:
        reasons = ", ".join(f"{count:,} × {why}" for why, count in skipped.items())
        notes.append(f"Decisions left out (fields a payment needs): {reasons}.")
    return notes
