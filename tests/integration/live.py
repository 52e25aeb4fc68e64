"""Helpers of the live-loop tests: isolated state folders, meshes with the loop, the acceptance
flow through Envoy, events from raw transactions, and online rows against the batch tables."""

from __future__ import annotations

import math
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pandas as pd

from fraud.v1 import events_pb2, features_pb2, features_pb2_grpc, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services import client
from services.common import scrape
from services.domain import aggregation as agg
from services.domain import featurespec
from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.online import OnlineFeatureReader
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port
from services.pipelines import dataset
from services.updater.partitions import partition_of

REL = 1e-9
STATE_FOLDERS = ("data", "feast", "models")
"""What a prepared state folder holds besides the loop's own state (log, states, spill)."""


def copy_state(source: Path, target: Path) -> Path:
    """A fresh state folder with ``source``'s dataset, Feast registry, online store and models,
    and no event log or entity states: a test that mutates the store owns its copy."""
    target.mkdir(parents=True, exist_ok=True)
    for name in STATE_FOLDERS:
        if (source / name).exists():
            shutil.copytree(source / name, target / name)
    return target


@dataclass(frozen=True)
class DayState:
    """A state folder whose store holds the history before the dataset's last whole day, and
    that day's payments in time order: a day to replay as it happened."""

    var_dir: Path
    day: pd.DataFrame
    start: datetime


def day_state(prepared_env: Any, folder: Path) -> DayState:
    """The prepared state's models, and its dataset up to its last whole day, applied and
    materialized in ``folder``; the day itself is kept apart for replaying."""
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    end = tx["timestamp"].max().floor("D")
    start = end - pd.Timedelta(days=1)
    history = tx[tx["timestamp"] < start]
    day = tx[(tx["timestamp"] >= start) & (tx["timestamp"] < end)]
    shutil.copytree(prepared_env.model_root, folder / "models")
    settings = FeatureStoreSettings(var_dir=folder, store="sqlite")
    dataset.write(dataset.Dataset.from_transactions(history), settings.data_path)
    store_admin.apply(settings)
    store_admin.materialize(settings)
    return DayState(folder, day.sort_values("timestamp"), start.to_pydatetime())


def day_request(row: Any, suffix: str = "") -> pb.ScoreRequest:
    """The Score request of one of the dataset's payments (a row of ``itertuples``), at its
    own time; ``suffix`` makes its transaction id another payment's."""
    request = pb.ScoreRequest(
        transaction_id=f"{row.transaction_id}{suffix}",
        card_id=row.card_id,
        merchant_id=row.merchant_id,
        amount_minor=int(row.amount_minor),
        currency=row.currency,
        terminal_id=row.terminal_id if isinstance(row.terminal_id, str) else "",
        channel=(
            pb.CHANNEL_CARD_NOT_PRESENT
            if row.channel == featurespec.CARD_NOT_PRESENT
            else pb.CHANNEL_CARD_PRESENT
        ),
    )
    request.timestamp.FromDatetime(row.timestamp.to_pydatetime())
    return request


def start_live_mesh(
    var_dir: Path,
    log_dir: Path,
    store: str = "sqlite",
    metrics: tuple[str, ...] = ("updater", "gateway"),
    **config: Any,
) -> Mesh:
    """A mesh with the live loop on free ports, ``metrics`` serving /metrics; with Redis,
    materialized at start."""
    cfg = MeshConfig.on_free_ports(
        var_dir=var_dir,
        store=store,
        log_dir=log_dir,
        metrics_ports={name: free_port() for name in metrics},
        **config,
    )
    mesh = Mesh(cfg)

    def ready(name: str) -> None:
        if name == "redis":
            store_admin.materialize(
                FeatureStoreSettings(
                    var_dir=var_dir,
                    store="redis",
                    redis_connection=f"{cfg.host}:{cfg.redis_port}",
                )
            )

    mesh.start(timeout_s=180, on_ready=ready)
    return mesh


def metric(url: str, name: scrape.Metric, **labels: str) -> float:
    """The sum of a metric's samples (with these labels) at a /metrics endpoint; 0 if absent."""
    return scrape.fetch(url).sum(name, **labels)


def metrics_url(mesh: Mesh, process: str) -> str:
    """The /metrics URL of one of the mesh's processes."""
    return scrape.url(mesh.config.host, mesh.config.metrics_ports[process])


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> float:
    """Polls until ``predicate()``; returns the seconds it took; fails after ``timeout_s``."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.01)
    return time.monotonic() - start


# --- the acceptance flow ------------------------------------------------------------------


@dataclass(frozen=True)
class FlowResult:
    """What the acceptance flow saw."""

    card_id: str
    visible_after_s: float
    """From the last answered payment to the feature service reporting all 12."""
    features: dict[str, float]
    large: pb.ScoreResponse
    outcome: outcomes_pb2.ReportOutcomeResponse
    transaction_ids: list[str]
    """Every distinct transaction scored (the 12 small ones, then the large one, last, after
    any large one answered on default features)."""


RETRIED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})
"""Statuses a payment client retries with the same ``transaction_id``."""


def _score(stub: pb_grpc.FraudScoringStub, request: pb.ScoreRequest) -> pb.ScoreResponse:
    """One payment as a client sends it: retried with the same ``transaction_id`` when the
    call timed out or found no upstream (a machine busy starting the mesh can hold one call
    past a second), at most three tries. A retry is the same payment, which the flows below
    check is counted once."""
    for attempt in range(3):
        try:
            return stub.Score(request, timeout=2.0)
        except grpc.RpcError as error:
            if error.code() not in RETRIED or attempt == 2:  # type: ignore[attr-defined]
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def _features(
    stub: features_pb2_grpc.FeatureServiceStub, request: features_pb2.GetFeaturesRequest
) -> dict[str, float]:
    """The features the service reports now; none when the call timed out (a wait retries)."""
    try:
        reply = stub.GetFeatures(request, timeout=2.0)
    except grpc.RpcError as error:
        if error.code() not in RETRIED:  # type: ignore[attr-defined]
            raise
        return {}
    return {f.name: f.value for f in reply.features}


def _request(card_id: str, merchant_id: str, tid: str, amount_minor: int) -> pb.ScoreRequest:
    request = pb.ScoreRequest(
        transaction_id=tid,
        card_id=card_id,
        merchant_id=merchant_id,
        amount_minor=amount_minor,
        currency="EUR",
        channel=pb.CHANNEL_CARD_NOT_PRESENT,
    )
    request.timestamp.FromNanoseconds(time.time_ns())
    return request


def card_testing_flow(mesh: Mesh, merchant_id: str) -> FlowResult:
    """Through Envoy: 12 tiny card-not-present payments on a new card (3 of them sent twice
    with the same transaction_id, as a client retry would), then the feature service is
    polled until the card's 1-hour count is 12, then a large payment, then its outcome."""
    card_id = f"card-live-{uuid.uuid4().hex[:10]}"
    tids = [f"live-{uuid.uuid4().hex[:12]}" for _ in range(12)]
    with grpc.insecure_channel(mesh.config.envoy_target) as edge:
        grpc.channel_ready_future(edge).result(timeout=10)
        stub = pb_grpc.FraudScoringStub(edge)
        for i, tid in enumerate(tids):
            request = _request(card_id, merchant_id, tid, 99)
            _score(stub, request)
            if i < 3:
                _score(stub, request)
        features: dict[str, float] = {}
        target = f"{mesh.config.host}:{mesh.config.features_port}"
        with grpc.insecure_channel(target) as channel:
            features_stub = features_pb2_grpc.FeatureServiceStub(channel)

            def counted() -> bool:
                features.update(
                    _features(
                        features_stub,
                        features_pb2.GetFeaturesRequest(card_id=card_id, merchant_id=merchant_id),
                    )
                )
                return features.get("card_txn_count_1h", 0) >= 12

            visible = wait_for(counted, "the burst in the online store", 30)
        large_tids: list[str] = []
        for _ in range(3):
            # On a busy machine the feature read can miss its slice, and the answer is then
            # on default features: the large payment is sent again, as a new one.
            large_tids.append(f"live-{uuid.uuid4().hex[:12]}")
            large = _score(stub, _request(card_id, merchant_id, large_tids[-1], 180_000))
            if large.feature_source != pb.FEATURE_SOURCE_DEFAULT:
                break
    outcome = client.report_outcome(
        mesh.config.envoy_target, large_tids[-1], outcomes_pb2.OUTCOME_FRAUD, timeout_s=10.0
    )
    return FlowResult(card_id, visible, features, large, outcome, [*tids, *large_tids])


def assert_flow(result: FlowResult) -> None:
    """The acceptance criteria of the flow."""
    assert result.features["card_txn_count_1h"] == 12  # retries counted once
    assert result.features["card_small_txn_count_1h"] == 12
    assert result.large.decision in (pb.DECISION_REVIEW, pb.DECISION_DECLINE), result.large
    assert any("under 2 EUR" in r for r in result.large.reasons), result.large.reasons
    assert result.outcome.transaction_id == result.transaction_ids[-1]
    assert len(result.outcome.event_id) == 32


TERMINAL_PAYMENTS = 5
"""Payments ``terminal_flow`` makes at a new terminal."""


def terminal_flow(mesh: Mesh, merchant_id: str) -> dict[str, float]:
    """Through Envoy: ``TERMINAL_PAYMENTS`` payments at a new terminal of the merchant (one sent
    twice, as a client retry would), then the feature service is polled until the terminal's
    1-day count is all of them; returns the features it reported last."""
    card_id = f"card-live-{uuid.uuid4().hex[:10]}"
    terminal_id = f"{merchant_id}-tlive-{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(mesh.config.envoy_target) as edge:
        grpc.channel_ready_future(edge).result(timeout=10)
        stub = pb_grpc.FraudScoringStub(edge)
        for i in range(TERMINAL_PAYMENTS):
            request = _request(card_id, merchant_id, f"live-{uuid.uuid4().hex[:12]}", 2_500)
            request.channel = pb.CHANNEL_CARD_PRESENT
            request.terminal_id = terminal_id
            _score(stub, request)
            if i == 0:
                _score(stub, request)
    features: dict[str, float] = {}
    target = f"{mesh.config.host}:{mesh.config.features_port}"
    with grpc.insecure_channel(target) as channel:
        features_stub = features_pb2_grpc.FeatureServiceStub(channel)

        def counted() -> bool:
            features.update(
                _features(
                    features_stub,
                    features_pb2.GetFeaturesRequest(
                        card_id=card_id, merchant_id=merchant_id, terminal_id=terminal_id
                    ),
                )
            )
            return features.get("terminal_txn_count_1d", 0) >= TERMINAL_PAYMENTS

        wait_for(counted, "the terminal's payments in the online store", 30)
    return features


def assert_terminal_flow(features: dict[str, float]) -> None:
    """The terminal's row counts each payment once and has no labelled history yet."""
    assert features["terminal_txn_count_1d"] == TERMINAL_PAYMENTS
    assert features["terminal_txn_count_7d"] == TERMINAL_PAYMENTS
    assert features["terminal_labelled_txn_count_28d"] == 0
    assert features["terminal_fraud_rate_28d"] == 0


# --- events from raw transactions, and the batch to compare with --------------------------


def decision_envelope(
    row: pd.Series, transaction_id: str | None = None
) -> events_pb2.EventEnvelope:
    """The decision event the gateway emits for one raw transaction, decided now."""
    envelope = events_pb2.EventEnvelope()
    event = envelope.decision
    event.event_id = uuid.uuid4().hex
    event.transaction_id = transaction_id or str(row["transaction_id"])
    event.card_id = str(row["card_id"])
    event.merchant_id = str(row["merchant_id"])
    event.amount_minor = int(row["amount_minor"])
    event.currency = str(row["currency"])
    event.card_not_present = row["channel"] == featurespec.CARD_NOT_PRESENT
    terminal = row.get("terminal_id")
    event.terminal_id = terminal if isinstance(terminal, str) else ""
    event.timestamp.FromNanoseconds(int(row["timestamp"].value))
    event.decided_at.FromNanoseconds(time.time_ns())
    return envelope


def outcome_envelope(
    transaction_id: str, fraud: bool, reported_s: float
) -> events_pb2.EventEnvelope:
    """The outcome event ReportOutcome appends."""
    envelope = events_pb2.EventEnvelope()
    event = envelope.outcome
    event.event_id = uuid.uuid4().hex
    event.transaction_id = transaction_id
    event.outcome = outcomes_pb2.OUTCOME_FRAUD if fraud else outcomes_pb2.OUTCOME_LEGITIMATE
    event.source = outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK
    event.reported_at.FromNanoseconds(round(reported_s * 1e9))
    event.received_at.FromNanoseconds(time.time_ns())
    return envelope


def as_live(tx: pd.DataFrame) -> pd.DataFrame:
    """Transactions as the live path knows them: a request's fields, no codes, no labels."""
    return tx.assign(
        card_home_country=float("nan"),
        merchant_country=float("nan"),
        merchant_category=float("nan"),
        is_fraud=False,
    )


Expected = dict[str, dict[str, float]]
"""Entity id → feature name → value, for one view."""


def newest_rows(
    tx: pd.DataFrame, unmoved: frozenset[tuple[str, pd.Timestamp]] = frozenset()
) -> tuple[Expected, Expected, Expected]:
    """Each card's, merchant's and terminal's newest batch row over ``tx``, leaving out the
    terminal rows at the ``unmoved`` (terminal, report) instants where no payment was."""

    def newest(table: pd.DataFrame, key: str) -> Expected:
        last = table.sort_values("event_timestamp").groupby(key).tail(1).set_index(key)
        last = last.drop(columns=["event_timestamp"])
        return {
            str(k): {n: math.nan if pd.isna(v) else float(v) for n, v in row.items()}
            for k, row in last.iterrows()
        }

    terminals = agg.terminal_feature_table(tx)
    if unmoved:
        paid = set(zip(tx["terminal_id"], tx["timestamp"], strict=True))
        keys = zip(terminals["terminal_id"], terminals["event_timestamp"], strict=True)
        terminals = terminals[[key not in unmoved or key in paid for key in keys]]
    return (
        newest(agg.card_feature_table(tx), "card_id"),
        newest(agg.merchant_feature_table(tx), "merchant_id"),
        newest(terminals, "terminal_id"),
    )


def _differs(got: float | None, want: float, name: str, mean_30d: float | None) -> bool:
    if math.isnan(want):
        return got is not None
    if got is None:
        return True
    if name == "card_amount_std_30d":
        scale = (mean_30d or 0.0) ** 2 + want**2
        return abs(got**2 - want**2) > REL * scale + 1e-12
    return abs(got - want) > REL * max(abs(want), 1e-12)


def store_mismatches(
    settings: FeatureStoreSettings,
    cards: Expected,
    merchants: Expected,
    terminals: Expected | None = None,
    limit: int = 5,
) -> list[str]:
    """Entities whose online row differs from the expected one (at most ``limit`` named).

    Each entity is read alone (the other keys unknown): ``OnlineFeatureReader.read`` gives
    ``STORE_FEATURES``, the card's, the merchant's, then the terminal's when one is named."""
    reader = OnlineFeatureReader(settings)
    n_card, n_merchant = len(featurespec.CARD_FEATURES), len(featurespec.MERCHANT_FEATURES)
    views: list[tuple[Expected, Callable[[str], tuple[str, str, str]], int, tuple[str, ...]]] = [
        (cards, lambda k: (k, "merchant-none", ""), 0, featurespec.CARD_FEATURES),
        (merchants, lambda k: ("card-none", k, ""), n_card, featurespec.MERCHANT_FEATURES),
        (
            terminals or {},
            lambda k: ("card-none", "merchant-none", k),
            n_card + n_merchant,
            featurespec.TERMINAL_FEATURES,
        ),
    ]
    mean_at = featurespec.CARD_FEATURES.index("card_amount_mean_30d")
    try:
        bad: list[str] = []
        for expected, keys, first, names in views:
            for entity_id, want in expected.items():
                card_id, merchant_id, terminal_id = keys(entity_id)
                reads = reader.read(card_id, merchant_id, time.time(), terminal_id)
                mean = reads[mean_at].value if first == 0 else None
                for name, read in zip(names, reads[first : first + len(names)], strict=True):
                    if _differs(read.value, want[name], name, mean):
                        bad.append(f"{entity_id}.{name}: {read.value} != {want[name]}")
                        break
                if len(bad) >= limit:
                    return bad
        return bad
    finally:
        reader.close()


# --- a replayed day ---------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """A history folder (dataset, registry, materialized store) and the day that follows it."""

    var_dir: Path
    events: list[events_pb2.EventEnvelope]
    """Outcomes of some of the day's transactions (before their decisions: held), the day's
    decisions (a tenth retried, some out of order, a fifth naming no terminal), then outcomes
    of history transactions."""
    expected: tuple[Expected, Expected, Expected]
    """Newest batch rows per card, merchant and terminal over the history and the day."""
    full: pd.DataFrame
    """The history and the day as the batch sees them, labels included."""
    seeded_until: pd.Timestamp
    """The history's newest payment: the seed's end."""

    def in_partitions(self, count: int) -> Replay:
        """The rows a group whose merchant-keyed topic has ``count`` partitions ends with.

        A partition's clock is the newest payment of its own merchants, so a report the seed
        holds for after the history's end moves its terminal's row only once a payment of the
        partition is as late (docs/aggregation.md, "A label moves the terminal's row"); the
        batch table's rows at later reports are left out."""
        full, end = self.full, self.seeded_until
        day = full[full["timestamp"] > end]
        clock = day.groupby(day["merchant_id"].map(_partition(count)))["timestamp"].max()
        carried = full[
            full["is_fraud"].astype(bool)
            & full["fraud_reported_at"].isna()
            & full["terminal_id"].notna()
            & (full["timestamp"] <= end)
        ]
        due = carried["timestamp"] + agg.LABEL_DELAY
        partitions = carried["merchant_id"].map(_partition(count))
        unmoved = frozenset(
            (terminal, at)
            for terminal, at, p in zip(carried["terminal_id"], due, partitions, strict=True)
            if at > end and (p not in clock.index or at > clock[p])
        )
        return replace(self, expected=newest_rows(full, unmoved))


def _partition(count: int) -> Callable[[str], int]:
    return lambda merchant_id: partition_of(merchant_id.encode(), count)


def replay_day(prepared_env: Any, var_dir: Path) -> Replay:
    """The prepared history less its last day, materialized in ``var_dir``, and the events
    of that day (``Replay``)."""
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    cut = tx["timestamp"].max() - pd.Timedelta(days=1)
    history, day = tx[tx["timestamp"] <= cut], tx[tx["timestamp"] > cut]
    day = day.assign(terminal_id=day["terminal_id"].where(np.arange(len(day)) % 5 != 0, None))
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    dataset.write(dataset.Dataset.from_transactions(history), settings.data_path)
    store_admin.apply(settings)
    store_admin.materialize(settings)

    rng = np.random.default_rng(3)
    # Outcomes that overtake their decisions (keyed by transaction on the log): held until
    # the decision comes, then labels of the merchant and the terminal.
    early = day[day["terminal_id"].notna()].sample(10, random_state=5)
    early_s = day["timestamp"].max().timestamp()
    events = [outcome_envelope(str(t), True, early_s) for t in early["transaction_id"]]
    # Out of order by up to ten minutes; a tenth of the decisions sent twice (retries).
    micros = day["timestamp"].astype("int64").to_numpy() // 1000
    order = np.argsort(micros + rng.integers(0, 600_000_000, len(day)))
    for i in order:
        row = day.iloc[int(i)]
        events.append(decision_envelope(row))
        if rng.random() < 0.1:
            events.append(decision_envelope(row))
    # Outcomes of history transactions inside the merchants' fraud-rate windows: some turn
    # out fraud (reported during the day), some frauds turn out legitimate.
    reported_s = (cut + pd.Timedelta(hours=12)).timestamp()
    window = history[
        (history["timestamp"] > cut - pd.Timedelta(days=30))
        & (history["timestamp"] < cut - pd.Timedelta(days=8))
    ]
    flipped = window[~window["is_fraud"]].sample(40, random_state=4)
    cleared = window[window["is_fraud"]].head(5)
    events += [outcome_envelope(str(t), True, reported_s) for t in flipped["transaction_id"]]
    events += [outcome_envelope(str(t), False, reported_s) for t in cleared["transaction_id"]]

    full = pd.concat([history, as_live(day)], ignore_index=True)
    full["fraud_reported_at"] = pd.Series(pd.NaT, index=full.index, dtype=full["timestamp"].dtype)
    fraud_now = full["transaction_id"].isin(flipped["transaction_id"])
    full.loc[fraud_now, "is_fraud"] = True
    full.loc[fraud_now, "fraud_reported_at"] = pd.Timestamp(reported_s, unit="s", tz="UTC")
    fraud_early = full["transaction_id"].isin(early["transaction_id"])
    full.loc[fraud_early, "is_fraud"] = True
    full.loc[fraud_early, "fraud_reported_at"] = pd.Timestamp(early_s, unit="s", tz="UTC")
    full.loc[full["transaction_id"].isin(cleared["transaction_id"]), "is_fraud"] = False
    return Replay(var_dir, events, newest_rows(full), full, history["timestamp"].max())


def wait_equal(var_dir: Path, replay: Replay) -> None:
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    cards, merchants, terminals = replay.expected
    assert terminals  # the simulated data names terminals: they are compared too
    last: list[str] = []

    def equal() -> bool:
        nonlocal last
        last = store_mismatches(settings, cards, merchants, terminals)
        return not last

    try:
        wait_for(equal, "online rows equal to the batch", timeout_s=120)
    except AssertionError as error:
        raise AssertionError(f"{error}; still differing: {last}") from None
