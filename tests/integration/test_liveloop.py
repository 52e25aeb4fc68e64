"""The live loop on the embedded defaults (SQLite store, file event log), through Envoy."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from typer.testing import CliRunner

from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.cli.main import app
from services.common import metric_catalogue as catalogue
from services.eventlog import EventLogSettings, open_consumer
from services.mesh import Mesh, grpc_serving

from .conftest import Known
from .live import (
    TERMINAL_PAYMENTS,
    assert_flow,
    assert_terminal_flow,
    card_testing_flow,
    copy_state,
    metric,
    metrics_url,
    start_live_mesh,
    terminal_flow,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def live_mesh(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh with the loop on a copy of the prepared state (the test changes its store)."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path_factory.mktemp("live-var"))
    mesh = start_live_mesh(var_dir, var_dir / "logs")
    yield mesh
    mesh.stop()


def test_a_card_testing_burst_is_seen_by_the_next_payment(live_mesh: Mesh, known: Known) -> None:
    result = card_testing_flow(live_mesh, known.merchant_id)
    assert_flow(result)
    updater = metrics_url(live_mesh, "updater")
    wait_for(
        lambda: metric(updater, catalogue.UPDATER_RECORDS, kind="outcome") >= 1,
        "the outcome at the updater",
    )
    assert metric(updater, catalogue.UPDATER_CHANGES, view="card", change="duplicate") >= 3


def test_the_updater_is_ready_and_reports_freshness(live_mesh: Mesh, known: Known) -> None:
    assert grpc_serving(f"{live_mesh.config.host}:{live_mesh.config.updater_port}")
    card_testing_flow(live_mesh, known.merchant_id)
    updater = metrics_url(live_mesh, "updater")
    assert metric(updater, catalogue.UPDATER_EVENT_TO_STORE.count) >= 12
    for view in ("card", "merchant"):
        age = metric(updater, catalogue.FEATURE_FRESHNESS, view=view)
        assert math.isfinite(age) and age >= 0
    assert metric(updater, catalogue.UPDATER_READY) == 1


def test_a_terminal_s_payments_are_seen_by_its_next_payment(live_mesh: Mesh, known: Known) -> None:
    updater = metrics_url(live_mesh, "updater")
    applied = metric(updater, catalogue.UPDATER_CHANGES, view="terminal", change="applied")
    assert_terminal_flow(terminal_flow(live_mesh, known.merchant_id))
    after = metric(updater, catalogue.UPDATER_CHANGES, view="terminal", change="applied")
    assert after - applied >= TERMINAL_PAYMENTS
    assert metric(updater, catalogue.UPDATER_CHANGES, view="terminal", change="duplicate") >= 1
    age = metric(updater, catalogue.FEATURE_FRESHNESS, view="terminal")
    assert math.isfinite(age) and age >= 0


def _outcome_request(**overrides: Any) -> outcomes_pb2.ReportOutcomeRequest:
    fields: dict[str, Any] = {
        "transaction_id": "t-1",
        "outcome": outcomes_pb2.OUTCOME_FRAUD,
        "source": outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK,
    }
    fields.update(overrides)
    request = outcomes_pb2.ReportOutcomeRequest(**fields)
    if "reported_at" not in overrides:
        request.reported_at.FromNanoseconds(time.time_ns())
    return request


def _stamp(seconds: float) -> Any:
    request = outcomes_pb2.ReportOutcomeRequest()
    request.reported_at.FromNanoseconds(round(seconds * 1e9))
    return request.reported_at


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"transaction_id": ""}, "transaction_id"),
        ({"transaction_id": "x" * 10_000}, "transaction_id"),
        ({"outcome": outcomes_pb2.OUTCOME_UNSPECIFIED}, "outcome"),
        ({"outcome": 42}, "outcome"),
        ({"source": outcomes_pb2.OUTCOME_SOURCE_UNSPECIFIED}, "source"),
        ({"reported_at": None}, "reported_at"),
        ({"reported_at": _stamp(time.time() + 86_400)}, "reported_at"),
    ],
)
def test_report_outcome_names_the_invalid_field(
    live_mesh: Mesh, overrides: dict[str, Any], field: str
) -> None:
    if overrides.get("reported_at", ...) is None:
        request = _outcome_request()
        request.ClearField("reported_at")
    else:
        request = _outcome_request(**overrides)
    with (
        grpc.insecure_channel(live_mesh.config.envoy_target) as edge,
        pytest.raises(grpc.RpcError) as caught,
    ):
        outcomes_pb2_grpc.OutcomeServiceStub(edge).ReportOutcome(request, timeout=5.0)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert error.details().startswith(field)  # type: ignore[attr-defined]
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert bad_request.field_violations[0].field == field


def _decided(settings: EventLogSettings, group: str) -> set[str]:
    """Transaction ids of every decision on the log, read by a group of the test's own."""
    found: set[str] = set()
    with open_consumer(settings, group) as consumer:
        while records := consumer.poll(1000, 0.2):
            for record in records:
                envelope = record.envelope()
                if envelope.WhichOneof("event") == "decision":
                    found.add(envelope.decision.transaction_id)
    return found


def test_sigterm_delivers_every_decision_the_gateway_answered(
    live_mesh: Mesh, known: Known
) -> None:
    gateway = live_mesh.processes["gateway"]
    original = dict(gateway.env)
    # Events wait in the gateway's memory for seconds (linger) and it stops without a drain
    # period: what reaches the log is what the ordered shutdown flushed.
    gateway.env = {
        **original,
        "FRAUD_EVENTLOG_LINGER_MS": "4000",
        "FRAUD_GATEWAY_DRAIN_SECONDS": "0",
    }
    live_mesh.restart("gateway")
    try:
        tids = [f"sigterm-{uuid.uuid4().hex[:12]}" for _ in range(30)]
        target = f"{live_mesh.config.host}:{live_mesh.config.gateway_port}"
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            for tid in tids:
                request = pb.ScoreRequest(
                    transaction_id=tid,
                    card_id=known.card_id,
                    merchant_id=known.merchant_id,
                    amount_minor=known.amount_minor,
                    currency="EUR",
                )
                request.timestamp.FromNanoseconds(time.time_ns())
                stub.Score(request, timeout=2.0)
        assert gateway.stop() == 0
        settings = EventLogSettings(var_dir=live_mesh.config.var_dir, groups=())
        assert set(tids) <= _decided(settings, f"audit-{uuid.uuid4().hex[:8]}")
    finally:
        gateway.env = original
        live_mesh.restart("gateway")


def test_after_the_stop_the_decision_log_holds_the_flow(
    prepared_env: Any, known: Known, tmp_path: Path
) -> None:
    """The acceptance flow, then the mesh stops as Ctrl-C stops ``fraudmesh up``: the export
    holds each of the 13 decisions once (the retries too are one decision) and the outcome."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path / "var")
    mesh = start_live_mesh(var_dir, var_dir / "logs")
    try:
        result = card_testing_flow(mesh, known.merchant_id)
    finally:
        mesh.stop()
    assert_flow(result)
    out = tmp_path / "decisions.parquet"
    exported = CliRunner().invoke(
        app,
        ["decisions", "export", "--var-dir", str(var_dir), "--out", str(out)],
        catch_exceptions=False,
    )
    assert exported.exit_code == 0, exported.output
    table = pq.read_table(out).to_pandas()
    flow = table[table["card_id"] == result.card_id].set_index("transaction_id")
    assert sorted(flow.index) == sorted(result.transaction_ids)
    large = flow.loc[result.transaction_ids[-1]]
    assert large["outcome"] == "fraud", large.to_dict()
    assert flow.drop(index=result.transaction_ids[-1])["outcome"].isna().all()
