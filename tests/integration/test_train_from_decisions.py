"""``fraudmesh train --from-decisions``: decisions and outcomes written by the real decision
sink, merged with the session's history into a training dataset of its own; a candidate is
published, live and the serving dataset stay as they were."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from datetime import UTC
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from fraud.v1 import events_pb2, outcomes_pb2, scoring_pb2
from services.cli.main import app
from services.decisionlog.metrics import SinkMetrics
from services.decisionlog.settings import DecisionLogSettings
from services.decisionlog.sink import DecisionSink
from services.domain import featurespec
from services.eventlog import EventLogSettings, events, open_producer
from services.featurestore import layout
from services.models import repository
from services.models.lifecycle import ModelLifecycle, VersionState

pytestmark = pytest.mark.integration

_KEEP = {"data", "data.versions", "feast", "models"}
_SCHEMA = events.feature_schema_id(featurespec.MODEL_FEATURES)


def _copy_var(prepared_env: Any, dest: Path) -> Path:
    """The session's dataset, Feast state and models (nothing other tests wrote beside them)."""
    top = str(prepared_env.var_dir)
    shutil.copytree(
        prepared_env.var_dir,
        dest,
        symlinks=True,
        ignore=lambda folder, names: [n for n in names if folder == top and n not in _KEEP],
    )
    return dest


def _ns(moment: pd.Timestamp) -> int:
    return int(moment.value)


def _decision(row: Any, tx: str, at: pd.Timestamp, event_id: str) -> events_pb2.EventEnvelope:
    """A decision on a payment shaped like the history's ``row``, made at ``at``."""
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = event_id
    d.transaction_id = tx
    d.card_id = row.card_id
    d.merchant_id = row.merchant_id
    d.terminal_id = row.terminal_id or ""
    d.amount_minor = int(row.amount_minor)
    d.currency = row.currency
    d.card_not_present = row.channel == featurespec.CARD_NOT_PRESENT
    d.timestamp.FromNanoseconds(_ns(at))
    d.decided_at.FromNanoseconds(_ns(at) + 3_000_000)
    d.features.extend(0.5 for _ in featurespec.MODEL_FEATURES)
    d.feature_schema = _SCHEMA
    d.feature_source = scoring_pb2.FEATURE_SOURCE_ONLINE
    d.score = 0.1
    d.decision = scoring_pb2.DECISION_APPROVE
    d.scored_by = scoring_pb2.SCORED_BY_MODEL
    d.model_version = "fraud-lgbm/1"
    d.route = events_pb2.ROUTE_LIVE
    d.elapsed_ms = 2.0
    return envelope


def _outcome(tx: str, kind: int, reported: pd.Timestamp) -> events_pb2.EventEnvelope:
    envelope = events_pb2.EventEnvelope()
    o = envelope.outcome
    o.event_id = f"o-{tx}-{kind}"
    o.transaction_id = tx
    o.outcome = kind  # type: ignore[assignment]
    o.source = outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK
    o.reported_at.FromNanoseconds(_ns(reported))
    o.received_at.FromNanoseconds(_ns(reported) + 60_000_000_000)
    return envelope


def _write_log(envelopes: list[events_pb2.EventEnvelope], root: Path, tmp_path: Path) -> None:
    """Appends the events to a file event log and runs the real sink until it has written
    them all, then stops it in order."""
    log = EventLogSettings(backend="file", var_dir=tmp_path / "eventlog", topic="t", groups=())
    producer = open_producer(log)
    for envelope in envelopes:
        producer.append(envelope)
    producer.close()
    sink = DecisionSink(
        DecisionLogSettings(root=root, flush_interval_s=0.05),
        log,
        SinkMetrics(CollectorRegistry()),
    )
    stop = threading.Event()
    thread = threading.Thread(target=sink.run, args=(stop,))
    thread.start()
    try:
        assert sink.caught_up.wait(120)
    finally:
        stop.set()
        thread.join(120)
    assert sum(sink.stats.read.values()) == len(envelopes)


def _fingerprint(var_dir: Path) -> dict[str, str]:
    """What serving reads: the data link's target, every dataset file, the registry and the
    online store, by content."""
    data = var_dir / "data"
    found = {"data -> ": str(data.readlink())}
    files = [*sorted(data.resolve().iterdir()), var_dir / "feast" / "registry.db"]
    files.append(var_dir / "feast" / "online.db")
    for path in files:
        found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())  # the console wraps long lines


def test_train_from_decisions_publishes_a_candidate_and_leaves_serving_alone(
    prepared_env: Any, tmp_path: Path
) -> None:
    var = _copy_var(prepared_env, tmp_path / "var")
    models = var / "models"
    lifecycle = ModelLifecycle(models)
    live = lifecycle.read().routing.live
    assert live == prepared_env.model_version
    before = _fingerprint(var)
    train = ["train", "--from-decisions", "--var-dir", str(var)]

    code, output = _run(*train)
    assert code == 1 and "no decision log in" in output and "fraudmesh up" in output
    code, output = _run(*train, "--work-dir", str(var))
    assert code == 1 and "would replace the serving dataset" in output

    history = pd.read_parquet(var / "data" / layout.TRANSACTIONS_FILE)
    now = pd.Timestamp.now(tz=UTC)
    older = history[
        (history["timestamp"] >= now - pd.Timedelta(days=20))
        & (history["timestamp"] < now - pd.Timedelta(days=9))
        & ~history["is_fraud"]
    ]
    rows = list(older.iloc[::97].itertuples())
    assert len(rows) >= 51
    fraud, legit, disputed = (
        outcomes_pb2.OUTCOME_FRAUD,
        outcomes_pb2.OUTCOME_LEGITIMATE,
        outcomes_pb2.OUTCOME_DISPUTED,
    )
    day = pd.Timedelta(days=1)
    envelopes: list[events_pb2.EventEnvelope] = []
    # 40 new payments older than the label delay: 12 frauds, 6 legitimate, 3 disputed, 19
    # without an outcome (genuine after the delay).
    for i, row in enumerate(rows[:40]):
        at = row.timestamp + pd.Timedelta(seconds=90)
        envelopes.append(_decision(row, f"dl-{i}", at, f"d-dl-{i}"))
        kind = fraud if i < 12 else legit if i < 18 else disputed if i < 21 else None
        if kind is not None:
            envelopes.append(_outcome(f"dl-{i}", kind, at + 2 * day))
    # A retried Score call of dl-0: the first decision is kept.
    envelopes.append(_decision(rows[0], "dl-0", rows[0].timestamp + pd.Timedelta(seconds=95), "r"))
    # 4 payments of the history decided by the mesh (a replay): taken once; two reported as
    # fraud (relabelled), one without an outcome, one disputed (the history's label stays).
    for i, row in enumerate(rows[40:44]):
        envelopes.append(_decision(row, row.transaction_id, row.timestamp, f"d-h-{i}"))
        kind = fraud if i < 2 else disputed if i == 3 else None
        if kind is not None:
            envelopes.append(_outcome(row.transaction_id, kind, row.timestamp + 3 * day))
    # 6 payments of the last two days: 5 without an outcome yet (no label), 1 fraud.
    for i, row in enumerate(rows[44:50]):
        at = now - pd.Timedelta(hours=1 + 8 * i)
        envelopes.append(_decision(row, f"dl-recent-{i}", at, f"d-recent-{i}"))
    envelopes.append(_outcome("dl-recent-0", fraud, now - pd.Timedelta(minutes=30)))
    # A decision no payment can come from (an unknown currency), and an outcome of a
    # transaction the log never decided.
    bad = _decision(rows[50], "dl-bad", rows[50].timestamp, "d-bad")
    bad.decision.currency = "ZZZ"
    envelopes.append(bad)
    envelopes.append(_outcome("never-decided", fraud, now - 5 * day))
    _write_log(envelopes, var / "decisions", tmp_path)

    code, output = _run(*train, "--model-root", str(models))
    assert code == 0, output
    assert "26 outcome(s) read" in output
    assert "labelled by outcomes: 21 (15 fraud, 6 legitimate)" in output

    candidate = repository.latest_version(models)
    assert candidate is not None and candidate != live
    state = lifecycle.read()
    assert state.routing.live == live, "a retrained version went live without --promote"
    assert state.versions[candidate].state is VersionState.CANDIDATE
    assert state.history[-1].by == "fraudmesh train --from-decisions"
    assert f"v{candidate} is candidate" in output

    metadata, folder = repository.load(models, version=candidate)
    history_frauds = int(history["is_fraud"].sum())
    expected = {
        "source_outcomes_read": 26,
        "source_decisions": 51,
        "source_decisions_skipped": 1,
        "source_history_rows": len(history),
        "source_decisions_in_history": 4,
        "source_decision_rows": 46,
        "source_outcome_frauds": 15,
        "source_outcome_legitimate": 6,
        "source_labelled_by_outcome": 21,
        "source_disputed": 3,
        "source_presumed_genuine": 19,
        "source_unlabelled_recent": 5,
        "source_relabelled_history": 2,
        "source_rows": len(history) + 46,
        "source_frauds": history_frauds + 15,
        "source_unlabelled_rows": 8,
    }
    assert {k: metadata.metrics.get(k) for k in expected} == expected
    report = json.loads((folder / "evaluation.json").read_text())
    assert report["source"]["decision_rows"] == 46
    assert "training data" in (folder / "evaluation.md").read_text()
    # The default periods end on the label horizon's day (now - 7 days).
    horizon_day = (now - pd.Timedelta(days=7)).floor("D")
    assert metadata.training_window.end == horizon_day.to_pydatetime()

    assert _fingerprint(var) == before, "the serving dataset, registry or online store changed"
    work = var / "training" / "from-decisions" / "data"
    built = pd.read_parquet(work / layout.TRANSACTIONS_FILE).set_index("transaction_id")
    assert built.index.is_unique and len(built) == len(history) + 46
    labels = built["is_fraud"]
    assert labels["dl-0"] and labels["dl-11"] and labels["dl-recent-0"]
    assert not labels["dl-12"] and not labels["dl-30"]
    assert pd.isna(labels["dl-18"]) and pd.isna(labels["dl-recent-1"])
    assert labels[rows[40].transaction_id] and not labels[rows[42].transaction_id]
    assert not labels[rows[43].transaction_id]
    assert built.loc["dl-0", "fraud_scenario"] == "decision_log"
    assert built.loc["dl-1", "channel"] in (featurespec.CARD_PRESENT, featurespec.CARD_NOT_PRESENT)
    assert layout.data_present(work)

    code, output = _run("model", "list", "--model-root", str(models))
    assert code == 0 and "46 payments from the decision log" in output, output


def test_train_from_decisions_options_need_the_flag(prepared_env: Any) -> None:
    code, output = _run("train", "--var-dir", str(prepared_env.var_dir), "--work-dir", "x")
    assert code == 2 and "--from-decisions" in output
