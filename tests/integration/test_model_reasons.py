"""Reasons from the model through Envoy on a real mesh: a REVIEW or DECLINE the model gives
names its own features, and their contributions with the base add up to the score it
served."""

from __future__ import annotations

import html
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pandas as pd
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common.edge_security import EdgeSettings
from services.console.app import create
from services.console.settings import ConsoleSettings
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh
from services.models import repository
from services.models.explain import DEFAULT_TOP_K
from tests.timeouts import register_logs
from tests.unit.test_console_controls import Client

from .conftest import Known, score_request, start_mesh

pytestmark = pytest.mark.integration

LINE = re.compile(r"^model feature (\S+) = (\S+): ([+-]\d+\.\d+) log-odds \(toward (\w+)\)$")
SUMMARY = re.compile(
    r"^model log-odds (\S+) = base (\S+) (\S+) from (\d+) features above (\S+) from (\d+) others$"
)
AMOUNTS_MINOR = (900_000, 4_000_000, 20_000_000, 90_000_000)
"""Large payments, up to the plausibility limit: the model's declines are among them."""


@pytest.fixture(scope="module")
def mesh(
    prepared_env: Any, known: Known, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[Mesh]:
    """A mesh whose gateways give the model's own reasons (off by default)."""
    logs = register_logs(request, tmp_path_factory.mktemp("reasons-logs"))
    m = start_mesh(prepared_env, logs, known=known, FRAUD_GATEWAY_MODEL_REASONS=str(DEFAULT_TOP_K))
    yield m
    m.stop()


def _risky(prepared_env: Any, known: Known, n: int = 6) -> Iterator[pb.ScoreRequest]:
    """Payments most likely to be declined: large, card not present, at the merchants and on
    the cards with the most frauds in the data."""
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    frauds = tx[(tx["is_fraud"] == 1) & (tx["currency"] == "EUR")]
    merchants = frauds["merchant_id"].value_counts().index[:n]
    cards = frauds["card_id"].value_counts().index[:n]
    for merchant, card in zip(merchants, cards, strict=False):
        terminals = tx.loc[tx["merchant_id"] == merchant, "terminal_id"].dropna()
        terminal = str(terminals.value_counts().index[0]) if len(terminals) else ""
        for amount in AMOUNTS_MINOR:
            yield score_request(
                known,
                card_id=str(card),
                merchant_id=str(merchant),
                terminal_id=terminal,
                amount_minor=amount,
                channel=pb.CHANNEL_CARD_NOT_PRESENT,
            )


def _model_flag(stub: pb_grpc.FraudScoringStub, requests: Iterator[pb.ScoreRequest]) -> Any:
    """The first REVIEW or DECLINE the model gives on the store's features with its own
    reasons (the gateway explains both). Each request is tried up to thrice: on a loaded
    machine a call may miss its slice and be answered by a fallback, read default features
    (then the gateway gives no model reasons, by design), or find no budget left for the
    explanation (none either). Which of the risky payments the model declines rather than
    reviews depends on the live features, which the module's own calls move."""
    seen = []
    for request in requests:
        for _ in range(3):
            # A fresh id each try: the decision log keeps a transaction's first decision.
            request.transaction_id = f"t-{time.time_ns()}"
            response = stub.Score(request, timeout=2.0)
            explained = any(LINE.match(r) for r in response.reasons)
            seen.append((response.decision, response.scored_by, response.feature_source, explained))
            if (
                response.scored_by != pb.SCORED_BY_MODEL
                or response.feature_source == pb.FEATURE_SOURCE_DEFAULT
            ):
                continue  # a fallback or no features: the same payment again
            if response.decision == pb.DECISION_APPROVE:
                break  # the model approves this one: the next payment
            if explained:
                return response
    pytest.fail(f"no explained model REVIEW or DECLINE among the risky payments: {seen}")


def test_a_flag_carries_the_models_contributions_summing_to_its_score(
    edge: grpc.Channel, known: Known, prepared_env: Any
) -> None:
    stub = pb_grpc.FraudScoringStub(edge)
    response = _model_flag(stub, _risky(prepared_env, known))
    reasons = list(response.reasons)
    assert reasons[0].startswith("model score"), reasons
    lines = [LINE.match(r) for r in reasons[1 : 1 + DEFAULT_TOP_K]]
    assert all(lines), reasons
    metadata, _ = repository.load(prepared_env.model_root, version=response.model_version)
    named = [m.group(1) for m in lines if m is not None]
    assert set(named) <= set(metadata.feature_order), named
    log_odds = [float(m.group(3)) for m in lines if m is not None]
    # Largest first, each with its sign.
    assert [abs(x) for x in log_odds] == sorted((abs(x) for x in log_odds), reverse=True)
    for m, x in zip(lines, log_odds, strict=True):
        assert m is not None and m.group(4) == ("fraud" if x >= 0 else "legitimate")
    summary = SUMMARY.match(reasons[1 + DEFAULT_TOP_K])
    assert summary is not None, reasons
    stated, base, shown, above, rest, others = (float(g) for g in summary.groups())
    assert int(above) == DEFAULT_TOP_K and int(others) == len(metadata.feature_order) - above
    assert abs(sum(log_odds) - shown) < 1e-6
    raw = base + shown + rest
    assert abs(raw - stated) < 1e-6
    # The trees explained are the served ones: their probability is the served score.
    assert abs(1.0 / (1.0 + math.exp(-raw)) - response.score) <= 1e-6, (raw, response.score)
    # Threshold-written reasons of the rules that fired still follow the model's own.
    assert not any(LINE.match(r) for r in reasons[2 + DEFAULT_TOP_K :])


def test_the_models_reasons_reach_the_decision_log_and_the_consoles_decision_page(
    edge: grpc.Channel, known: Known, prepared_env: Any, mesh: Mesh
) -> None:
    stub = pb_grpc.FraudScoringStub(edge)
    response = _model_flag(stub, _risky(prepared_env, known))
    contributions = [r for r in response.reasons if LINE.match(r)]
    assert len(contributions) == DEFAULT_TOP_K, list(response.reasons)
    var_dir = mesh.config.var_dir
    app = create(
        ConsoleSettings(var_dir=var_dir, prometheus_url=None, allow_unauthenticated_remote=True),
        EdgeSettings(var_dir=var_dir),
        store=FeatureStoreSettings(var_dir=var_dir),
    )
    page = ""
    deadline = time.monotonic() + 60
    # The decision sink writes the log a batch at a time: wait for this decision's row.
    while time.monotonic() < deadline:
        status, page = Client(app).get(f"/decisions?transaction_id={response.transaction_id}")
        assert status == 200
        if html.escape(contributions[0], quote=False) in page:
            break
        time.sleep(1.0)
    for line in contributions:
        assert html.escape(line, quote=False) in page, (line, page[-3000:])
