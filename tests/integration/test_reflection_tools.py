"""Reflection as the tools use it, with no proto files: ghz calls Score by its method symbol
through Envoy, and grpcurl describes methods, messages, fields and enum values on every
service."""

from __future__ import annotations

import json
import subprocess

import pytest

from services.mesh import Mesh

from .conftest import Known, go_tool

pytestmark = pytest.mark.integration


def test_ghz_calls_score_by_its_method_symbol_through_envoy(mesh: Mesh, known: Known) -> None:
    body = {
        "transaction_id": "ghz-{{.RequestNumber}}",
        "card_id": known.card_id,
        "merchant_id": known.merchant_id,
        "amount_minor": known.amount_minor,
        "currency": "EUR",
        "timestamp": "{{.Timestamp}}",
    }
    ran = subprocess.run(
        [go_tool("ghz"), "--insecure", "--call", "fraud.v1.FraudScoring.Score",
         "-d", json.dumps(body), "-n", "50", "-c", "2", "--format", "json",
         mesh.config.envoy_target],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    statuses = report["statusCodeDistribution"]
    # Every call reached Score by its symbol: answered, or cut by the edge's 50 ms cap when
    # this shared machine stalls (on-time answers are judged in the timing lane, alone). A
    # symbol reflection could not resolve fails every call with another status.
    assert set(statuses) <= {"OK", "DeadlineExceeded"}, report.get("errorDistribution")
    assert statuses.get("OK", 0) >= 40, report.get("errorDistribution")


@pytest.mark.parametrize(
    ("service", "symbol", "expect"),
    [
        ("envoy", "fraud.v1.FraudScoring.Score", "rpc Score ( .fraud.v1.ScoreRequest )"),
        ("envoy", "fraud.v1.ScoreRequest.card_id", "string card_id = 2;"),
        ("envoy", "fraud.v1.Decision.DECISION_DECLINE", "DECISION_DECLINE = 3;"),
        ("envoy", "grpc.health.v1.Health.Check", "rpc Check"),
        ("features", "fraud.v1.FeatureService.GetFeatures", "rpc GetFeatures"),
        ("features", "fraud.v1.Feature.status", "status = 3;"),
        ("scorer", "inference.GRPCInferenceService.ModelInfer", "rpc ModelInfer"),
        ("scorer", "inference.ModelInferRequest.InferInputTensor", "message InferInputTensor"),
    ],
)
def test_grpcurl_describes_symbols_of_every_service(
    mesh: Mesh, service: str, symbol: str, expect: str
) -> None:
    c = mesh.config
    port = {"envoy": c.envoy_port, "features": c.features_port, "scorer": c.scorer_port}[service]
    ran = subprocess.run(
        [go_tool("grpcurl"), "-plaintext", f"{c.host}:{port}", "describe", symbol],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 0, ran.stderr
    assert expect in ran.stdout, ran.stdout


def test_symbols_a_server_does_not_serve_are_not_found(mesh: Mesh) -> None:
    target = f"{mesh.config.host}:{mesh.config.features_port}"
    ran = subprocess.run(
        [go_tool("grpcurl"), "-plaintext", target, "describe", "fraud.v1.FraudScoring.Score"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode != 0
