"""Minimal fallbacks with real processes: scorer down ⇒ the small model; features down ⇒
defaults."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.gateway.settings import GatewaySettings
from services.mesh import Mesh
from services.models.lifecycle import ModelLifecycle

from .conftest import ANSWER_DEADLINE_S, Known, start_mesh

_HALF_OPEN_PROBES = GatewaySettings().breaker_half_open_calls

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def faulty(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh of its own, since these tests stop and restart its processes."""
    m = start_mesh(prepared_env, tmp_path_factory.mktemp("fallback-logs"))
    yield m
    m.stop()


def _score(mesh: Mesh, known: Known) -> pb.ScoreResponse:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    request = pb.ScoreRequest(
        transaction_id=f"f-{time.time_ns()}",
        card_id=known.card_id,
        merchant_id=known.merchant_id,
        amount_minor=known.amount_minor,
        currency="EUR",
        timestamp=ts,
    )
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        return pb_grpc.FraudScoringStub(channel).Score(request, timeout=ANSWER_DEADLINE_S)


def faulty_version(mesh: Mesh) -> str:
    """The live version the mesh's gateway answers with."""
    return ModelLifecycle(mesh.config.var_dir / "models").read().routing.live or ""


def _until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _scored_by(mesh: Mesh, known: Known) -> int | None:
    """Who answered a Score, or None when it ran out its deadline at Envoy: a pause of a loaded
    machine, which the waits below take as not yet rather than as a failure."""
    try:
        return _score(mesh, known).scored_by
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        return None


def _model_steadily(mesh: Mesh, known: Known, timeout_s: float = 20.0) -> bool:
    """Whether the model answers enough calls in a row that the scorer's breaker is closed.

    A scorer that has just come back may still see the gateway's channel in reconnect backoff;
    those failures, with the ones while it was down, can open the breaker on the first success
    that fills its minimum. More answers in a row than the half-open probes mean it closed again.
    """
    in_a_row = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _scored_by(mesh, known) == pb.SCORED_BY_MODEL:
            in_a_row += 1
            if in_a_row > _HALF_OPEN_PROBES:
                return True
        else:
            in_a_row = 0
            time.sleep(0.1)
    return False


def test_scorer_down_means_the_small_model_then_model_again(faulty: Mesh, known: Known) -> None:
    # A loaded machine may slow one call past the model's slice: wait for a model answer.
    assert _until(lambda: _scored_by(faulty, known) == pb.SCORED_BY_MODEL, 10.0)
    faulty.processes["scorer"].signal(signal.SIGKILL)
    faulty.processes["scorer"].popen.wait(10)  # type: ignore[union-attr]
    for _ in range(5):
        response = _score(faulty, known)
        # The version's small model stands in, with its own thresholds; not the rules.
        assert response.scored_by == pb.SCORED_BY_SMALL_MODEL
        assert response.model_version == faulty_version(faulty)
        assert response.decision != pb.DECISION_UNSPECIFIED
        assert any(r.startswith("small model fallback") for r in response.reasons)
    faulty.restart("scorer")
    assert _model_steadily(faulty, known)


def test_features_down_means_default_features(faulty: Mesh, known: Known) -> None:
    # Judged from a steady scorer: the test before this one may have left its breaker open.
    assert _model_steadily(faulty, known)
    faulty.processes["features"].signal(signal.SIGKILL)
    faulty.processes["features"].popen.wait(10)  # type: ignore[union-attr]
    response = _score(faulty, known)
    assert response.feature_source == pb.FEATURE_SOURCE_DEFAULT
    assert response.scored_by in (pb.SCORED_BY_MODEL, pb.SCORED_BY_RULES)
    assert _until(lambda: _score(faulty, known).scored_by == pb.SCORED_BY_MODEL, 10.0)
    faulty.restart("features")
    assert _until(lambda: _score(faulty, known).feature_source == pb.FEATURE_SOURCE_ONLINE, 10.0)


def test_sigterm_drains_and_exits_cleanly(faulty: Mesh) -> None:
    process = faulty.processes["gateway"]
    process.signal(signal.SIGTERM)
    assert process.popen is not None
    assert process.popen.wait(30) == 0
    tail = process.log_tail(10)
    assert '"msg": "draining"' in tail and '"msg": "stopped"' in tail
    assert "drain cut short" not in tail
    faulty.restart("gateway")


def test_sigint_during_the_drain_cuts_it_short(faulty: Mesh) -> None:
    """What the mesh sends the services behind its stopped Envoys: nothing routes there."""
    process = faulty.processes["gateway"]
    assert process.log_path is not None

    def drains() -> int:
        return process.log_path.read_text(errors="replace").count('"msg": "draining"')  # type: ignore[union-attr]

    before = drains()
    process.signal(signal.SIGTERM)
    # The log is the process's across restarts: wait for this stop's drain.
    assert _until(lambda: drains() > before, 10.0)
    process.signal(signal.SIGINT)
    assert process.popen is not None
    assert process.popen.wait(30) == 0
    tail = process.log_tail(3)
    assert "drain cut short" in tail and '"msg": "stopped"' in tail
    faulty.restart("gateway")
