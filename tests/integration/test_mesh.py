"""The mesh end to end through Envoy, on the embedded SQLite store, with real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from fraud.v1 import features_pb2, features_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.domain import featurespec
from services.featurestore import layout
from services.mesh import Mesh

from .conftest import (
    ANSWER_DEADLINE_S,
    Known,
    Recorder,
    first_of,
    full_quality,
    go_tool,
    score_request,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _request(known: Known, **overrides: object) -> pb.ScoreRequest:
    return score_request(known, **overrides)


def test_known_card_is_scored_by_the_model_with_online_features(
    edge: grpc.Channel, known: Known
) -> None:
    stub = pb_grpc.FraudScoringStub(edge)
    request = _request(known)
    calls = Recorder(lambda: stub.Score(request, timeout=1.0))
    response = full_quality(calls)
    assert response.transaction_id == request.transaction_id
    assert response.decision in (pb.DECISION_APPROVE, pb.DECISION_REVIEW, pb.DECISION_DECLINE)
    assert 0.0 <= response.score <= 1.0
    assert response.model_version
    assert response.reasons and response.reasons[0].startswith("model score")
    assert calls.elapsed_is_consistent(), calls.seen


def test_a_known_terminal_is_read_through_the_gateway(edge: grpc.Channel, known: Known) -> None:
    stub = pb_grpc.FraudScoringStub(edge)
    with_terminal = _request(known, terminal_id=known.terminal_id)
    full_quality(lambda: stub.Score(with_terminal, timeout=1.0))
    # An unknown terminal leaves its features to the defaults: partial.
    unknown = _request(known, terminal_id="term-unknown")
    full_quality(lambda: stub.Score(unknown, timeout=1.0), source=pb.FEATURE_SOURCE_PARTIAL)


def _typical_payments(prepared_env: Any, known: Known, cards: int) -> list[Known]:
    """Payments typical of their card: the busiest cards never defrauded (a compromised card's
    own history makes it look at risk), each at its usual merchant at home for its median
    amount there. The known card is left out: this module's other tests pay with it, and
    the live loop makes it look busy."""
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    fraud = tx["is_fraud"].fillna(False).astype(bool)
    tx = tx[
        (tx["currency"] == "EUR")
        & (tx["merchant_country"] == tx["card_home_country"])
        & ~tx["card_id"].isin(tx.loc[fraud, "card_id"])
        & (tx["card_id"] != known.card_id)
    ]
    payments: list[Known] = []
    for card in tx["card_id"].value_counts().index[:cards]:
        mine = tx[tx["card_id"] == card]
        merchant = str(mine["merchant_id"].value_counts().index[0])
        amount = int(mine.loc[mine["merchant_id"] == merchant, "amount_minor"].median())
        payments.append(Known(str(card), merchant, amount, ""))
    return payments


def test_typical_payments_are_approved(edge: grpc.Channel, prepared_env: Any, known: Known) -> None:
    # The model reviews about 1 % of genuine payments: several typical ones, not one.
    payments = _typical_payments(prepared_env, known, cards=5)
    assert len(payments) == 5
    stub = pb_grpc.FraudScoringStub(edge)
    answers = [
        full_quality(lambda payment=payment: stub.Score(_request(payment), timeout=1.0))
        for payment in payments
    ]
    decisions = [answer.decision for answer in answers]
    assert pb.DECISION_DECLINE not in decisions, answers
    assert decisions.count(pb.DECISION_APPROVE) >= 4, answers


def test_unknown_card_is_not_an_error(edge: grpc.Channel, known: Known) -> None:
    request = _request(known, card_id="card-never-seen")
    stub = pb_grpc.FraudScoringStub(edge)
    response = full_quality(
        lambda: stub.Score(request, timeout=1.0), source=pb.FEATURE_SOURCE_PARTIAL
    )
    assert any("defaults" in reason for reason in response.reasons)


def _future(seconds: int) -> Timestamp:
    ts = Timestamp()
    ts.FromSeconds(int(time.time()) + seconds)
    return ts


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"transaction_id": ""}, "transaction_id"),
        ({"card_id": ""}, "card_id"),
        ({"merchant_id": ""}, "merchant_id"),
        ({"amount_minor": -100}, "amount_minor"),
        ({"amount_minor": 9_000_000_000_000}, "amount_minor"),
        ({"currency": "ABC"}, "currency"),
        ({"timestamp": _future(86_400)}, "timestamp"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(
    edge: grpc.Channel, known: Known, overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.FraudScoringStub(edge).Score(
            _request(known, **overrides), timeout=ANSWER_DEADLINE_S
        )
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error.details().startswith(field)  # type: ignore[attr-defined]
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert bad_request.field_violations[0].field == field


def test_a_zero_amount_account_verification_is_scored_by_the_model(
    edge: grpc.Channel, known: Known
) -> None:
    request = _request(known, amount_minor=0)
    stub = pb_grpc.FraudScoringStub(edge)
    response = full_quality(lambda: stub.Score(request, timeout=1.0))
    assert response.scored_by == pb.SCORED_BY_MODEL, response
    assert response.feature_source == pb.FEATURE_SOURCE_ONLINE, response
    assert 0.0 <= response.score <= 1.0
    assert response.decision in (pb.DECISION_APPROVE, pb.DECISION_REVIEW, pb.DECISION_DECLINE)


def test_missing_timestamp_is_invalid_argument(edge: grpc.Channel, known: Known) -> None:
    request = _request(known)
    request.ClearField("timestamp")
    with pytest.raises(grpc.RpcError) as caught:
        pb_grpc.FraudScoringStub(edge).Score(request, timeout=ANSWER_DEADLINE_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert caught.value.details().startswith("timestamp")  # type: ignore[attr-defined]


def test_health_through_envoy(edge: grpc.Channel) -> None:
    reply = health_pb2_grpc.HealthStub(edge).Check(
        health_pb2.HealthCheckRequest(), timeout=ANSWER_DEADLINE_S
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_public_api_through_envoy(edge: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(edge)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=2.0
    )
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "fraud.v1.FraudScoring" in names


def test_grpcurl_without_protos_calls_score_through_envoy(mesh: Mesh, known: Known) -> None:
    grpcurl = go_tool("grpcurl")
    target = mesh.config.envoy_target
    listed = subprocess.run(
        [grpcurl, "-plaintext", target, "list"], capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    assert "fraud.v1.FraudScoring" in listed.stdout.split()
    body = {
        "transaction_id": "grpcurl-1",
        "card_id": known.card_id,
        "merchant_id": known.merchant_id,
        "amount_minor": known.amount_minor,
        "currency": "EUR",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def call() -> dict[str, Any]:
        called = subprocess.run(
            [grpcurl, "-plaintext", "-d", json.dumps(body), target, "fraud.v1.FraudScoring/Score"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert called.returncode == 0, called.stderr
        # grpcurl prints the proto field names.
        answer: dict[str, Any] = json.loads(called.stdout)
        return answer

    answer = first_of(call, lambda a: a["scored_by"] == "SCORED_BY_MODEL")
    assert answer["transaction_id"] == "grpcurl-1"
    assert answer["decision"].startswith("DECISION_")
    assert answer["scored_by"] == "SCORED_BY_MODEL"


def test_go_client_scores_through_envoy(mesh: Mesh, known: Known, go_score_client: Path) -> None:
    binary = go_score_client

    def call() -> dict[str, Any]:
        ran = subprocess.run(
            [
                str(binary),
                "-addr", mesh.config.envoy_target,
                "-timeout", f"{ANSWER_DEADLINE_S:g}s",
                "-card-id", known.card_id,
                "-merchant-id", known.merchant_id,
                "-amount-minor", str(known.amount_minor),
                "-json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        answer: dict[str, Any] = json.loads(ran.stdout)
        return answer

    answer = first_of(call, lambda a: a["scoredBy"] == "SCORED_BY_MODEL")
    assert answer["decision"].startswith("DECISION_")
    assert answer["scoredBy"] == "SCORED_BY_MODEL"
    bad = subprocess.run(
        [str(binary), "-addr", mesh.config.envoy_target, "-card-id", "", "-merchant-id", "m",
         "-amount-minor", "100"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert bad.returncode != 0


def test_feature_service_reports_present_and_missing(mesh: Mesh, known: Known) -> None:
    target = f"{mesh.config.host}:{mesh.config.features_port}"
    with grpc.insecure_channel(target) as channel:
        stub = features_pb2_grpc.FeatureServiceStub(channel)
        found = stub.GetFeatures(
            features_pb2.GetFeaturesRequest(
                card_id=known.card_id,
                merchant_id=known.merchant_id,
                terminal_id=known.terminal_id,
            ),
            timeout=2.0,
        )
        assert [f.name for f in found.features] == list(featurespec.STORE_FEATURES)
        assert all(f.status == features_pb2.FEATURE_STATUS_PRESENT for f in found.features)
        assert all(f.event_timestamp.seconds > 0 for f in found.features)
        # No terminal named: its features are missing, the others still present.
        without = stub.GetFeatures(
            features_pb2.GetFeaturesRequest(card_id=known.card_id, merchant_id=known.merchant_id),
            timeout=2.0,
        )
        terminal = set(featurespec.TERMINAL_FEATURES)
        for feature in without.features:
            missing = feature.status == features_pb2.FEATURE_STATUS_MISSING
            assert missing == (feature.name in terminal), feature.name
        unknown = stub.GetFeatures(
            features_pb2.GetFeaturesRequest(card_id="nobody", merchant_id="nowhere"), timeout=2.0
        )
        assert all(f.status == features_pb2.FEATURE_STATUS_MISSING for f in unknown.features)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetFeatures(features_pb2.GetFeaturesRequest(merchant_id="m"), timeout=2.0)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert caught.value.details().startswith("card_id")  # type: ignore[attr-defined]


def test_scorer_speaks_open_inference_protocol_v2(mesh: Mesh) -> None:
    target = f"{mesh.config.host}:{mesh.config.scorer_port}"
    n = len(featurespec.MODEL_FEATURES)
    with grpc.insecure_channel(target) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(v2.ServerLiveRequest(), timeout=2).live
        assert stub.ServerReady(v2.ServerReadyRequest(), timeout=2).ready
        meta = stub.ModelMetadata(v2.ModelMetadataRequest(name="fraud-lgbm"), timeout=2)
        assert meta.platform == "onnxruntime_onnx"
        assert list(meta.inputs[0].shape) == [-1, n]
        assert stub.ModelReady(v2.ModelReadyRequest(name="fraud-lgbm"), timeout=2).ready
        assert not stub.ModelReady(v2.ModelReadyRequest(name="other"), timeout=2).ready
        assert stub.ServerMetadata(v2.ServerMetadataRequest(), timeout=2).name
        rows = 3
        request = v2.ModelInferRequest(
            model_name="fraud-lgbm",
            inputs=[
                v2.ModelInferRequest.InferInputTensor(
                    name=meta.inputs[0].name,
                    datatype="FP32",
                    shape=[rows, n],
                    contents=v2.InferTensorContents(fp32_contents=[1.0] * (rows * n)),
                )
            ],
        )
        reply = stub.ModelInfer(request, timeout=2)
        proba = next(o for o in reply.outputs if o.datatype == "FP32")
        assert list(proba.shape) == [rows, 2]
        values = list(proba.contents.fp32_contents)
        assert all(abs(values[i] + values[i + 1] - 1.0) < 1e-5 for i in range(0, len(values), 2))
        request.inputs[0].shape[1] = n + 1
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=2)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert caught.value.details().startswith("inputs[0].shape")  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(v2.ModelMetadataRequest(name="other"), timeout=2)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_feature_stream_answers_each_request_by_id_and_fails_only_the_bad_one(
    mesh: Mesh, known: Known
) -> None:
    target = f"{mesh.config.host}:{mesh.config.features_port}"
    good = features_pb2.GetFeaturesRequest(
        card_id=known.card_id, merchant_id=known.merchant_id, terminal_id=known.terminal_id
    )
    requests = [
        features_pb2.StreamFeaturesRequest(id=7, timeout_us=2_000_000, lookups=[good]),
        features_pb2.StreamFeaturesRequest(
            id=8, lookups=[good, features_pb2.GetFeaturesRequest(merchant_id="m")]
        ),
        features_pb2.StreamFeaturesRequest(id=9, lookups=[good, good]),
    ]
    with grpc.insecure_channel(target) as channel:
        stub = features_pb2_grpc.FeatureServiceStub(channel)
        replies = {r.id: r for r in stub.StreamFeatures(iter(requests), timeout=10)}
    assert set(replies) == {7, 8, 9}
    assert replies[7].error_code == 0
    assert [f.name for f in replies[7].results[0].features] == list(featurespec.STORE_FEATURES)
    assert all(
        f.status == features_pb2.FEATURE_STATUS_PRESENT for f in replies[7].results[0].features
    )
    # The bad lookup fails its request (naming the field), not the stream.
    assert replies[8].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies[8].error_message.startswith("lookups[1].card_id")
    assert not replies[8].results
    assert len(replies[9].results) == 2


def test_triton_client_streams_inference_from_the_scorer(mesh: Mesh) -> None:
    target = f"{mesh.config.host}:{mesh.config.scorer_port}"
    script = Path(__file__).with_name("triton_stream.py")
    n = len(featurespec.MODEL_FEATURES)
    run = subprocess.run(
        [sys.executable, str(script), target, "fraud-lgbm", str(n)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.strip().splitlines()[-1])["results"]
    assert len(results) == 3
    answered = {r["id"]: r for r in results if "id" in r}
    errors = [r["error"] for r in results if "error" in r]
    assert set(answered) == {"a", "b"}
    assert answered["a"]["shape"] == [1, 2]
    assert answered["b"]["shape"] == [4, 2]
    assert all(abs(total - 1.0) < 1e-5 for r in answered.values() for total in r["row_sums"])
    # The bad request fails alone, with the field named; the stream carried on.
    assert len(errors) == 1
    assert "inputs[0].shape" in errors[0]
