"""The gateway's events and outcome validation, without a server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from services.common.errors import InvalidArgument
from services.domain import featurespec
from services.eventlog import ProducerClosedError
from services.eventlog.events import feature_schema_id
from services.gateway.events import (
    REPORTERS,
    VERDICTS,
    EventEmitter,
    decision_event,
    outcome_event,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, ScoredBy, ScoreResult, Source
from services.gateway.ports import Arm
from services.gateway.shadow import ShadowJob, ShadowResult
from services.gateway.validate import (
    Limits,
    OutcomeReport,
    Reporter,
    Verdict,
    validate_outcome,
)

NOW = 1_800_000_000.0


def _request() -> pb.ScoreRequest:
    request = pb.ScoreRequest(
        transaction_id="t-1",
        card_id="card-1",
        merchant_id="merch-00001",
        amount_minor=12_345,
        currency="EUR",
        terminal_id="term-1",
        channel=pb.CHANNEL_CARD_NOT_PRESENT,
    )
    request.timestamp.FromNanoseconds(1_800_000_000_123_456_789)
    return request


def _outcome() -> ScoreResult:
    return ScoreResult(
        Decision.REVIEW,
        0.42,
        ["model score 0.420 >= review threshold 0.300", "card not present"],
        "7",
        ScoredBy.MODEL,
        Source.PARTIAL,
        features=[float(i) for i in range(len(featurespec.MODEL_FEATURES))],
        feature_order=featurespec.MODEL_FEATURES,
    )


def _response() -> pb.ScoreResponse:
    return pb.ScoreResponse(
        transaction_id="t-1",
        decision=pb.DECISION_REVIEW,
        score=0.42,
        reasons=["model score 0.420 >= review threshold 0.300", "card not present"],
        model_version="7",
        scored_by=pb.SCORED_BY_MODEL,
        feature_source=pb.FEATURE_SOURCE_PARTIAL,
        elapsed_ms=3.5,
    )


def test_a_decision_event_says_what_was_asked_seen_and_answered() -> None:
    schema = feature_schema_id(featurespec.MODEL_FEATURES)
    envelope = decision_event(_request(), True, _outcome(), _response(), NOW + 0.25, schema)
    event = envelope.decision
    assert envelope.WhichOneof("event") == "decision"
    assert len(event.event_id) == 32
    assert (event.transaction_id, event.card_id, event.merchant_id) == (
        "t-1",
        "card-1",
        "merch-00001",
    )
    assert (event.amount_minor, event.currency, event.terminal_id) == (12_345, "EUR", "term-1")
    assert event.timestamp.ToNanoseconds() == 1_800_000_000_123_456_789  # exact, not via float
    assert event.card_not_present
    assert list(event.features) == pytest.approx(_outcome().features)
    assert not event.feature_names and event.feature_schema == schema
    assert event.decision == pb.DECISION_REVIEW and event.score == pytest.approx(0.42)
    assert event.scored_by == pb.SCORED_BY_MODEL
    assert event.feature_source == pb.FEATURE_SOURCE_PARTIAL
    assert event.model_version == "7" and list(event.reasons) == list(_response().reasons)
    assert event.route == events_pb2.ROUTE_LIVE and not event.HasField("shadow_score")
    assert event.elapsed_ms == pytest.approx(3.5)
    assert event.decided_at.ToNanoseconds() == round((NOW + 0.25) * 1e9)


class _Recording:
    def __init__(self) -> None:
        self.appended: list[events_pb2.EventEnvelope] = []

    def append(self, envelope: events_pb2.EventEnvelope) -> None:
        self.appended.append(envelope)


def test_a_canary_answer_carries_its_route_the_shadow_score_and_its_feature_names() -> None:
    async def scenario() -> events_pb2.DecisionEvent:
        producer = _Recording()
        metrics = GatewayMetrics(CollectorRegistry())
        emitter = EventEmitter(producer, featurespec.MODEL_FEATURES, metrics)  # type: ignore[arg-type]
        outcome = _outcome()
        outcome.arm = Arm.CANARY
        # A version trained on another feature order: its names travel with the event.
        outcome.feature_order = tuple(reversed(featurespec.MODEL_FEATURES))
        shadow_route = SimpleNamespace(version="9")
        tx = SimpleNamespace(card_id="card-1")
        job = ShadowJob(shadow_route, tx, {}, 0.42, Decision.REVIEW)  # type: ignore[arg-type]
        outcome.shadow = job
        job.when_done(lambda: emitter.decision(_request(), True, outcome, _response(), NOW))
        assert producer.appended == []  # the event waits for the shadow's score
        job.resolve(ShadowResult("9", 0.875, Decision.DECLINE, 0.002))
        await asyncio.sleep(0)
        assert len(producer.appended) == 1
        return producer.appended[0].decision

    event = asyncio.run(scenario())
    assert event.route == events_pb2.ROUTE_CANARY
    assert event.shadow_score == pytest.approx(0.875) and event.shadow_model_version == "9"
    names = tuple(reversed(featurespec.MODEL_FEATURES))
    assert tuple(event.feature_names) == names
    assert event.feature_schema == feature_schema_id(names)


def test_a_dropped_shadow_job_still_emits_the_decision_without_a_shadow_score() -> None:
    async def scenario() -> events_pb2.DecisionEvent:
        producer = _Recording()
        emitter = EventEmitter(
            producer,  # type: ignore[arg-type]
            featurespec.MODEL_FEATURES,
            GatewayMetrics(CollectorRegistry()),
        )
        outcome = _outcome()
        job = ShadowJob(SimpleNamespace(version="9"), SimpleNamespace(), {}, 0.42, Decision.REVIEW)  # type: ignore[arg-type]
        outcome.shadow = job
        job.when_done(lambda: emitter.decision(_request(), True, outcome, _response(), NOW))
        job.resolve(None)
        await asyncio.sleep(0)
        return producer.appended[0].decision

    event = asyncio.run(scenario())
    assert event.route == events_pb2.ROUTE_LIVE and not event.HasField("shadow_score")
    assert not event.shadow_model_version and not event.feature_names


def test_an_outcome_event_carries_the_report() -> None:
    report = OutcomeReport("t-1", Verdict.FRAUD, Reporter.CHARGEBACK, NOW - 60)
    event = outcome_event(report, NOW).outcome
    assert event.transaction_id == "t-1"
    assert event.outcome == outcomes_pb2.OUTCOME_FRAUD
    assert event.source == outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK
    assert event.reported_at.ToSeconds() == NOW - 60
    assert event.received_at.ToSeconds() == NOW
    assert event.reported_by == ""


def test_an_analyst_outcome_names_who_gave_it() -> None:
    report = validate_outcome(**_report(reported_by="alice@example.org"))
    assert report.reported_by == "alice@example.org"
    assert outcome_event(report, NOW).outcome.reported_by == "alice@example.org"


def test_every_proto_outcome_and_source_is_mapped() -> None:
    outcomes = set(outcomes_pb2.Outcome.values()) - {outcomes_pb2.OUTCOME_UNSPECIFIED}
    sources = set(outcomes_pb2.OutcomeSource.values()) - {outcomes_pb2.OUTCOME_SOURCE_UNSPECIFIED}
    assert set(VERDICTS) == outcomes
    assert set(REPORTERS) == sources


class _ClosedProducer:
    def append(self, envelope: events_pb2.EventEnvelope) -> None:
        raise ProducerClosedError("closed")


def test_a_failed_emit_is_counted_not_raised() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    emitter = EventEmitter(_ClosedProducer(), featurespec.MODEL_FEATURES, metrics)  # type: ignore[arg-type]
    errors = metrics.emit_errors.labels("decision")
    before = errors._value.get()
    emitter.decision(_request(), True, _outcome(), _response(), NOW, object())
    assert errors._value.get() - before == 1


def _report(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "transaction_id": "t-1",
        "verdict": Verdict.FRAUD,
        "reporter": Reporter.ANALYST,
        "reported_at": (int(NOW) - 3600, 0),
        "now_s": NOW,
        "limits": Limits(),
    }
    return fields | overrides


def test_a_valid_outcome_passes() -> None:
    report = validate_outcome(**_report())
    assert report == OutcomeReport("t-1", Verdict.FRAUD, Reporter.ANALYST, NOW - 3600)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"transaction_id": ""}, "transaction_id"),
        ({"transaction_id": "x" * 129}, "transaction_id"),
        ({"transaction_id": "bad\nid"}, "transaction_id"),
        ({"verdict": None}, "outcome"),
        ({"reporter": None}, "source"),
        ({"reported_at": None}, "reported_at"),
        ({"reported_at": (int(NOW), 1_000_000_000)}, "reported_at"),
        ({"reported_at": (int(NOW), -1)}, "reported_at"),
        ({"reported_at": (int(NOW) + 3600, 0)}, "reported_at"),
        ({"reported_at": (int(NOW) - 600 * 86_400, 0)}, "reported_at"),
        ({"reported_at": (253_402_300_800 * 10, 0)}, "reported_at"),
        ({"reported_by": "a" * 129}, "reported_by"),
        ({"reported_by": "ana\u0000lyst"}, "reported_by"),
        ({"reported_by": "ana\nlyst"}, "reported_by"),
    ],
)
def test_an_invalid_outcome_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_outcome(**_report(**overrides))
    assert caught.value.field == field


class _Log:
    """An event log in memory that can be read back (as the file log can)."""

    def __init__(self) -> None:
        self.stored: list[tuple[bytes, bytes]] = []

    def write(self, batch: Any) -> None:
        self.stored.extend(batch)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def position(self) -> str:
        return str(len(self.stored))

    def values_since(self, position: str) -> Any:
        return iter([v for _, v in self.stored[int(position or 0) :]])


def _journal(tmp_path: Any, log: _Log) -> Any:
    from services.eventlog import EventLogMetrics, EventLogSettings, JournalProducer

    settings = EventLogSettings(var_dir=tmp_path, linger_ms=1)
    return JournalProducer(settings, lambda: log, EventLogMetrics(CollectorRegistry()))


def test_a_journaled_decision_is_on_disk_before_the_answer(tmp_path: Any) -> None:
    log = _Log()
    producer = _journal(tmp_path, log)
    emitter = EventEmitter(
        producer, featurespec.MODEL_FEATURES, GatewayMetrics(CollectorRegistry())
    )
    assert emitter.journaled
    journaled = emitter.before_answer(_request(), True, _outcome(), _response(), NOW)
    assert journaled is not None and not journaled.needs_sync
    assert producer.stats.appended == 1  # written by the time the answer would be sent
    assert producer.flush(10)
    producer.close()
    event = events_pb2.EventEnvelope.FromString(log.stored[0][1]).decision
    assert event.transaction_id == "t-1" and event.score == pytest.approx(0.42)


def test_a_journaled_decision_gets_its_shadow_score_when_the_shadow_ends(tmp_path: Any) -> None:
    async def scenario() -> events_pb2.DecisionEvent:
        log = _Log()
        producer = _journal(tmp_path, log)
        emitter = EventEmitter(
            producer, featurespec.MODEL_FEATURES, GatewayMetrics(CollectorRegistry())
        )
        outcome = _outcome()
        job = ShadowJob(SimpleNamespace(version="9"), SimpleNamespace(), {}, 0.42, Decision.REVIEW)  # type: ignore[arg-type]
        outcome.shadow = job
        journaled = emitter.before_answer(_request(), True, outcome, _response(), NOW)
        assert journaled is not None
        job.when_done(journaled.complete)
        job.resolve(ShadowResult("9", 0.875, Decision.DECLINE, 0.002))
        await asyncio.sleep(0)
        assert await producer.aflush(10)
        await producer.aclose()
        assert len(log.stored) == 1
        return events_pb2.EventEnvelope.FromString(log.stored[0][1]).decision

    event = asyncio.run(scenario())
    assert event.shadow_score == pytest.approx(0.875) and event.shadow_model_version == "9"


def test_an_outcome_the_journal_cannot_take_is_refused(tmp_path: Any) -> None:
    from services.common.errors import Unavailable

    producer = _journal(tmp_path, _Log())
    metrics = GatewayMetrics(CollectorRegistry())
    emitter = EventEmitter(producer, featurespec.MODEL_FEATURES, metrics)

    def full(_data: bytes) -> int:
        raise OSError(28, "No space left on device")

    producer._own.append = full
    errors = metrics.emit_errors.labels("decision")
    before = errors._value.get()
    with pytest.raises(Unavailable):
        emitter.outcome(OutcomeReport("t-1", Verdict.FRAUD, Reporter.CHARGEBACK, NOW - 60))
    # A decision is still answered: counted, never raised.
    assert emitter.before_answer(_request(), True, _outcome(), _response(), NOW) is None
    assert errors._value.get() - before == 1
    assert producer.stats.dropped == 2
    producer.close()
