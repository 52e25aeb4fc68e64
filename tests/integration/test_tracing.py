"""OpenTelemetry tracing across real processes: one trace spans gateway, features and scorer."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc

from .conftest import ANSWER_DEADLINE_S, Known, first_of, start_mesh

pytestmark = pytest.mark.integration

TRACING = {
    "FRAUD_GATEWAY_TRACING": "console",
    "FRAUD_GATEWAY_TRACE_SAMPLE_RATIO": "1",
    "FRAUD_FEATURES_TRACING": "console",
    "FRAUD_SCORER_TRACING": "console",
}


def _spans(log: str) -> list[dict[str, Any]]:
    spans = []
    for line in log.splitlines():
        if line.startswith("{") and '"context"' in line:
            spans.append(json.loads(line))
    return spans


def test_one_trace_covers_all_three_services(
    prepared_env: Any, known: Known, tmp_path_factory: pytest.TempPathFactory
) -> None:
    logs = tmp_path_factory.mktemp("tracing-logs")
    mesh = start_mesh(prepared_env, logs, **TRACING)
    try:
        ts = Timestamp()
        ts.FromNanoseconds(time.time_ns())
        request = pb.ScoreRequest(
            transaction_id="traced-1",
            card_id=known.card_id,
            merchant_id=known.merchant_id,
            amount_minor=known.amount_minor,
            currency="EUR",
            timestamp=ts,
        )
        with grpc.insecure_channel(mesh.config.envoy_target) as channel:
            response = pb_grpc.FraudScoringStub(channel).Score(request, timeout=ANSWER_DEADLINE_S)
        assert response.scored_by == pb.SCORED_BY_MODEL
    finally:
        mesh.stop()  # ordered shutdown flushes the spans
    gateway = _spans((logs / "gateway.log").read_text())
    score = [s for s in gateway if s["name"] == "fraud.v1.FraudScoring/Score"]
    assert score, "no span for the Score call"
    trace_id = score[-1]["context"]["trace_id"]
    features = _spans((logs / "features.log").read_text())
    scorer = _spans((logs / "scorer.log").read_text())
    assert any(s["context"]["trace_id"] == trace_id for s in features)
    assert any(s["context"]["trace_id"] == trace_id for s in scorer)


def test_untraced_requests_travel_the_streams_of_traced_services(
    prepared_env: Any, known: Known, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Tracing on everywhere, nothing sampled: every request goes over the persistent
    # streams, through the servers' tracing interceptors, and is answered in full.
    logs = tmp_path_factory.mktemp("tracing-unsampled-logs")
    mesh = start_mesh(prepared_env, logs, **{**TRACING, "FRAUD_GATEWAY_TRACE_SAMPLE_RATIO": "0"})
    try:
        with grpc.insecure_channel(mesh.config.envoy_target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            attempts = itertools.count()

            def call(n: int) -> pb.ScoreResponse:
                ts = Timestamp()
                ts.FromNanoseconds(time.time_ns())
                request = pb.ScoreRequest(
                    transaction_id=f"untraced-{n}-{next(attempts)}",
                    card_id=known.card_id,
                    merchant_id=known.merchant_id,
                    amount_minor=known.amount_minor,
                    currency="EUR",
                    timestamp=ts,
                )
                return stub.Score(request, timeout=2.0)

            def score(n: int) -> pb.ScoreResponse:
                # What this test judges is the answer, not its time: a call Envoy cut at its
                # 50 ms cap on a saturated machine is sent again (another status fails at once).
                return first_of(lambda: call(n), lambda _: True, tries=3)

            # Breakers may still be cooling down from start-up on a loaded machine: wait for
            # a first full answer, then judge twenty.
            deadline = time.monotonic() + 30
            while score(-1).scored_by != pb.SCORED_BY_MODEL:
                assert time.monotonic() < deadline, "no model answer over the streams"
                time.sleep(0.2)
            answers = [score(n) for n in range(20)]
        # A starved machine may push a call past a slice: most must be full answers.
        full = [
            a
            for a in answers
            if a.scored_by == pb.SCORED_BY_MODEL and a.feature_source == pb.FEATURE_SOURCE_ONLINE
        ]
        assert len(full) >= 15, [(a.scored_by, a.feature_source) for a in answers]
    finally:
        mesh.stop()
    gateway = _spans((logs / "gateway.log").read_text())
    assert not [s for s in gateway if s["name"] == "fraud.v1.FraudScoring/Score"]
