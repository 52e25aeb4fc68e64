"""The console's pure parts: CSRF tokens, who gives a verdict, verdict checks, the review queue
and lookup over decision-log parts in a temporary folder, and the overview and monitor figures
from a fixed source."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fraud.v1 import outcomes_pb2, scoring_pb2
from services.cli import certs
from services.common import metric_catalogue as catalogue
from services.common.edge_security import DEV_FILES, EdgeSettings
from services.console import csrf, identity, overview, pages
from services.console.app import create
from services.console.models import read_models
from services.console.reviews import DecisionLogView, QueueFilter
from services.console.settings import ConsoleSettings
from services.console.sources import (
    Interval,
    PrometheusMonitor,
    Sample,
    SourceUnavailable,
    build_quality,
    parse_answer,
    parse_metrics_page,
)
from services.console.verdicts import (
    Given,
    RecentVerdicts,
    Verdict,
    VerdictRejected,
    parse_verdict,
)
from services.domain import featurespec

from .test_decisionlog import decision, outcome, write_flush

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
ORIGIN = "http://127.0.0.1:8090"


# -- CSRF -------------------------------------------------------------------------------------


def test_a_token_matches_only_its_cookie_and_key() -> None:
    guard = csrf.Csrf.with_key("k1")
    cookie = guard.new_cookie()
    token = guard.token(cookie)
    assert guard.refusal(cookie, token, {}, ORIGIN) is None
    assert guard.refusal(guard.new_cookie(), token, {}, ORIGIN) is not None
    assert csrf.Csrf.with_key("k2").refusal(cookie, token, {}, ORIGIN) is not None


@pytest.mark.parametrize(
    ("cookie", "token", "headers", "why"),
    [
        ("c", None, {}, "no CSRF token"),
        (None, "t", {}, "no CSRF cookie"),
        ("c", "not-the-token", {}, "does not match"),
        ("c", "TOKEN", {"origin": "http://127.0.0.1:9999"}, "another origin"),
        ("c", "TOKEN", {"origin": "null"}, "another origin"),
        ("c", "TOKEN", {"sec-fetch-site": "cross-site"}, "another site"),
        ("c", "TOKEN", {"sec-fetch-site": "same-site"}, "another site"),
    ],
)
def test_a_forged_request_is_refused_with_its_reason(
    cookie: str | None, token: str | None, headers: dict[str, str], why: str
) -> None:
    guard = csrf.Csrf.with_key("k")
    if token == "TOKEN":
        token = guard.token("c")
    reason = guard.refusal(cookie, token, headers, ORIGIN)
    assert reason is not None and why in reason


def test_the_pages_own_requests_pass() -> None:
    guard = csrf.Csrf.with_key(None)
    headers = {"origin": ORIGIN, "sec-fetch-site": "same-origin"}
    assert guard.refusal("c", guard.token("c"), headers, ORIGIN) is None


# -- who --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls")
    certs.write_dev_credentials(folder)
    return folder


def _verifier(tls_dir: Path) -> identity.TokenVerifier:
    return identity.TokenVerifier(tls_dir / DEV_FILES["jwks"], "fraudmesh-dev", "fraudmesh")


def test_a_valid_token_names_the_analyst(tls_dir: Path) -> None:
    token = certs.mint_token(tls_dir / DEV_FILES["jwt_key"], "alice@bank.example")
    principal = _verifier(tls_dir).principal(f"Bearer {token}")
    assert principal.name == "alice@bank.example" and principal.verified
    assert principal.token == token


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: None, "required"),
        (lambda d: "Basic YWxpY2U6eA==", "not a bearer"),
        (lambda d: "Bearer " + certs.mint_token(d / "jwt-key.pem", "a", ttl_s=-60), "expired"),
        (lambda d: "Bearer " + certs.mint_token(d / "jwt-key.pem", "a", audience="x"), "audience"),
        (lambda d: "Bearer " + certs.mint_token(d / "jwt-key.pem", "a", issuer="x"), "issuer"),
        (lambda d: "Bearer " + jwt.encode({"sub": "a"}, "s" * 32, algorithm="HS256"), "unknown"),
        (lambda d: "Bearer not.a.token", "not valid"),
    ],
)
def test_a_bad_token_is_refused(tls_dir: Path, make: object, why: str) -> None:
    with pytest.raises(identity.Unauthenticated) as caught:
        _verifier(tls_dir).principal(make(tls_dir))  # type: ignore[operator]
    assert why.lower() in str(caught.value).lower()


def test_a_token_for_another_key_is_refused(tls_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    certs.write_dev_credentials(other)
    token = certs.mint_token(other / DEV_FILES["jwt_key"], "mallory")
    with pytest.raises(identity.Unauthenticated):
        _verifier(tls_dir).principal(f"Bearer {token}")


def test_a_typed_in_name_follows_the_outcome_api_rule() -> None:
    assert identity.analyst_name_problem("Ana Lyst") is None
    assert identity.analyst_name_problem("") == "is required"
    assert identity.analyst_name_problem("a" * 129) is not None
    assert identity.analyst_name_problem("bad\u0000name") is not None


# -- verdicts ---------------------------------------------------------------------------------


def test_a_verdict_is_fraud_or_legitimate() -> None:
    assert parse_verdict("tx-1", "fraud") == ("tx-1", Verdict.FRAUD)
    assert parse_verdict("tx-1", "legitimate") == ("tx-1", Verdict.LEGITIMATE)
    for tid, verdict in (("tx-1", "disputed"), ("tx-1", ""), ("", "fraud"), ("a\nb", "fraud")):
        with pytest.raises(VerdictRejected):
            parse_verdict(tid, verdict)


def test_recent_verdicts_expire_and_stay_bounded() -> None:
    clock = [1000.0]
    recent = RecentVerdicts(keep_s=60, capacity=2, clock=lambda: clock[0])
    for i in range(3):
        recent.add(Given(f"tx-{i}", Verdict.FRAUD, "ana", f"e{i}", clock[0]))
    assert recent.transaction_ids() == {"tx-1", "tx-2"}
    clock[0] += 61
    assert recent.transaction_ids() == frozenset() and recent.get("tx-2") is None


# -- the queue and lookups over the decision log -------------------------------------------


def review(event_id: str, tx: str, at: datetime, **kwargs: object):  # type: ignore[no-untyped-def]
    envelope = decision(event_id, tx, at, **kwargs)  # type: ignore[arg-type]
    envelope.decision.decision = scoring_pb2.DECISION_REVIEW
    return envelope


def _view(root: Path, **kwargs: object) -> DecisionLogView:
    return DecisionLogView(root, clock=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def test_the_queue_holds_unsettled_reviews_newest_first(tmp_path: Path) -> None:
    features = [float(i) for i in range(len(featurespec.MODEL_FEATURES))]
    write_flush(
        tmp_path,
        1,
        [
            review("e1", "tx-1", NOW - timedelta(hours=3), features=features),
            review("e2", "tx-2", NOW - timedelta(hours=2)),
            review("e3", "tx-3", NOW - timedelta(hours=1)),
            review("e4", "tx-4", NOW - timedelta(minutes=30)),
            decision("e5", "tx-5", NOW),  # a DECLINE is never queued
            review("e1-retry", "tx-1", NOW),  # a retry keeps the first decision's time
            outcome("o2", "tx-2", outcomes_pb2.OUTCOME_FRAUD, reported=NOW),
            outcome("o3", "tx-3", outcomes_pb2.OUTCOME_DISPUTED, reported=NOW),  # still open
        ],
    )
    page = _view(tmp_path).queue(judged={"tx-4"})
    assert [d.transaction_id for d in page.items] == ["tx-3", "tx-1"]
    assert page.waiting == page.matching == 2
    oldest = page.items[-1]
    assert oldest.decided_at == NOW - timedelta(hours=3)
    assert oldest.features[0] == (featurespec.MODEL_FEATURES[0], 0.0)
    assert oldest.reasons == ("card velocity", "amount") and oldest.amount == "12.34 EUR"
    assert page.items[0].outcome is not None and page.items[0].outcome.outcome == "disputed"


def test_the_queue_filters_and_pages(tmp_path: Path) -> None:
    write_flush(
        tmp_path,
        1,
        [
            review(f"e{i}", f"tx-{i}", NOW - timedelta(minutes=i), card=f"card-{i % 2}")
            for i in range(9)
        ],
    )
    view = _view(tmp_path)
    page = view.queue(QueueFilter(card_id="card-1"), offset=1, limit=2)
    assert [d.transaction_id for d in page.items] == ["tx-3", "tx-5"]
    assert page.matching == 4 and page.waiting == 9
    window = QueueFilter(since=NOW - timedelta(minutes=4), until=NOW - timedelta(minutes=1))
    assert [d.transaction_id for d in view.queue(window).items] == ["tx-2", "tx-3", "tx-4"]
    assert view.queue(QueueFilter(model_version="fraud-lgbm/9")).matching == 0
    assert view.queue().model_versions == ["fraud-lgbm/3"]


def test_the_queue_reads_each_part_once_and_forgets_compacted_ones(tmp_path: Path) -> None:
    write_flush(tmp_path, 1, [review("e1", "tx-1", NOW - timedelta(days=1))])
    view = _view(tmp_path)
    assert view.queue().waiting == 1
    (part,) = (tmp_path / "decisions").rglob("part-*.parquet")
    # A part already read is not read again: its rows come from memory.
    part.write_bytes(b"not parquet any more")
    write_flush(tmp_path, 2, [review("e2", "tx-2", NOW)])
    assert view.queue().waiting == 2
    # Compaction replaces parts with a new one: the old chunk is dropped, the new part read.
    part.unlink()
    write_flush(tmp_path, 3, [review("e1", "tx-1", NOW - timedelta(days=1))])
    assert {d.transaction_id for d in view.queue().items} == {"tx-1", "tx-2"}


def test_the_queue_covers_its_window_and_bounds_its_rows(tmp_path: Path) -> None:
    write_flush(
        tmp_path,
        1,
        [review(f"e{d}", f"tx-{d}", NOW - timedelta(days=d)) for d in range(5)],
    )
    assert _view(tmp_path, queue_days=3).queue().waiting == 3
    bounded = _view(tmp_path, queue_days=5, max_rows=2).queue()
    assert bounded.truncated and [d.transaction_id for d in bounded.items] == ["tx-0", "tx-1"]


def test_a_lookup_finds_the_first_decision_and_its_latest_outcome(tmp_path: Path) -> None:
    write_flush(
        tmp_path,
        1,
        [
            decision("e1", "tx-1", NOW - timedelta(days=2), score=0.2),
            decision("e1-retry", "tx-1", NOW - timedelta(days=2, seconds=-1), score=0.9),
            decision("e2", "tx-2", NOW - timedelta(days=200)),
        ],
    )
    write_flush(
        tmp_path,
        2,
        [
            outcome("o1", "tx-1", outcomes_pb2.OUTCOME_DISPUTED, reported=NOW - timedelta(days=1)),
            outcome("o2", "tx-1", reported=NOW, reported_by="ana"),
        ],
    )
    view = _view(tmp_path)
    found = view.lookup("tx-1")
    assert found is not None and found.score == 0.2 and found.decision == "decline"
    assert found.outcome is not None
    assert (found.outcome.outcome, found.outcome.source, found.outcome.reported_by) == (
        "fraud",
        "chargeback",
        "ana",
    )
    assert found.outcome.reports == 2
    assert view.lookup("tx-2") is None  # older than lookup_days
    assert view.lookup("tx-unknown") is None


# -- overview and monitor ---------------------------------------------------------------------


class FixedPrometheus:
    """Answers each query from a table; an unknown query has no data."""

    where = "fixed"

    def __init__(self, answers: dict[str, list[Sample]], down: bool = False) -> None:
        self.answers = answers
        self.down = down
        self.asked: list[str] = []

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        self.asked.append(promql)
        self.at = at
        if self.down:
            raise SourceUnavailable("Prometheus at fixed is not reachable")
        return self.answers.get(promql, [])


def test_the_overview_shows_each_figure_scaled() -> None:
    by_key = {f.key: f for f in overview.FIGURES}
    breakers = next(b for b in overview.BREAKDOWNS if b.key == "breakers")
    source = FixedPrometheus(
        {
            by_key["throughput"].promql: [Sample({}, 412.5)],
            by_key["p99"].promql: [Sample({}, 0.0123)],
            by_key["on_time"].promql: [Sample({}, 0.997)],
            by_key["p50"].promql: [Sample({}, float("nan"))],
            breakers.promql: [
                Sample({"dependency": "scorer"}, 0.0),
                Sample({"dependency": "features"}, 2.0),
            ],
        }
    )
    data = asyncio.run(overview.load(source, at=1_700_000_000.0))
    assert data.problem is None and source.at == data.at == 1_700_000_000.0
    assert data.figures["throughput"].value == 412.5
    assert data.figures["p99"].value == pytest.approx(12.3)
    assert data.figures["on_time"].value == pytest.approx(99.7)
    assert data.figures["p50"].value is None and data.figures["p999"].value is None
    assert data.breakdowns["breakers"] == {"features": 2.0, "scorer": 0.0}
    assert len(source.asked) == len(overview.FIGURES) + len(overview.BREAKDOWNS)


def test_the_overview_says_when_prometheus_is_away() -> None:
    data = asyncio.run(overview.load(FixedPrometheus({}, down=True)))
    assert data.problem is not None and "not reachable" in data.problem


def test_prometheus_answers_are_parsed_and_errors_said() -> None:
    vector = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"a": "b"}, "value": [1, "2.5"]}]},
    }
    assert parse_answer(json.dumps(vector).encode()) == [Sample({"a": "b"}, 2.5)]
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1, "7"]}}
    assert parse_answer(json.dumps(scalar).encode()) == [Sample({}, 7.0)]
    with pytest.raises(SourceUnavailable, match="bad_data"):
        parse_answer(b'{"status": "error", "errorType": "bad_data", "error": "bad_data: x"}')
    with pytest.raises(SourceUnavailable, match="not JSON"):
        parse_answer(b"<html>")


def test_the_monitor_gauges_become_figures_per_version() -> None:
    v3 = {"model_version": "3"}
    source = FixedPrometheus(
        {
            catalogue.DRIFT_PSI.name: [
                Sample({**v3, "feature": "score"}, 0.04),
                Sample({**v3, "feature": "amount_eur"}, 0.21),
                Sample({**v3, "feature": "hour"}, 0.12),
                Sample({"model_version": "4", "feature": "score"}, float("nan")),
            ],
            catalogue.LIVE_RECALL.name: [
                Sample({**v3, "threshold": "review", "maturity": "matured"}, 0.8),
                Sample({**v3, "threshold": "review", "maturity": "immature"}, 0.5),
            ],
            catalogue.LABELLED_RATIO.name: [Sample({**v3, "maturity": "matured"}, 0.4)],
            catalogue.REFERENCE_PRECISION.name: [
                Sample({**v3, "threshold": "decline", "bound": b}, v)
                for b, v in (("low", 0.7), ("estimate", 0.8), ("high", 0.9))
            ],
            catalogue.RETRAINING_ADVISED.name: [Sample(v3, 1.0)],
        }
    )
    quality = asyncio.run(PrometheusMonitor(source).quality())
    assert set(quality) == {"3"}
    q = quality["3"]
    assert q.psi == {"score": 0.04, "amount_eur": 0.21, "hour": 0.12}
    assert q.feature_psi == [("amount_eur", 0.21), ("hour", 0.12)]
    assert list(q.live) == ["matured", "immature"]
    assert q.live["matured"].recall == {"review": 0.8} and q.live["matured"].precision == {}
    assert q.live["immature"].recall == {"review": 0.5}
    assert q.live["matured"].labelled_ratio == 0.4 and q.live["matured"].average_precision is None
    assert q.reference_precision == {"decline": Interval(0.7, 0.8, 0.9)}
    assert q.retraining_advised is True


def test_the_monitor_metrics_page_reads_as_prometheus_would() -> None:
    """The same figures from the exposition the monitor's registry writes."""
    registry = CollectorRegistry()
    psi = catalogue.DRIFT_PSI.create(registry)
    precision = catalogue.LIVE_PRECISION.create(registry)
    decisions = catalogue.WINDOW_DECISIONS.create(registry)
    psi.labels("7", "score").set(0.31)
    psi.labels("7", "amount_eur").set(float("nan"))
    precision.labels("7", "decline", "matured").set(0.66)
    decisions.labels("7", "canary").set(120)
    q = build_quality(parse_metrics_page(generate_latest(registry).decode()))["7"]
    assert q.psi == {"score": 0.31}
    assert q.live["matured"].precision == {"decline": 0.66}
    assert q.decisions == {"canary": 120.0}
    with pytest.raises(SourceUnavailable, match="did not parse"):
        parse_metrics_page("fraudmesh_drift_psi{model_version= 1\n")


def test_the_models_page_shows_drift_and_live_quality_by_maturity(tmp_path: Path) -> None:
    v = {"model_version": "1"}
    quality = build_quality(
        {
            catalogue.DRIFT_PSI.name: [
                Sample({**v, "feature": "score"}, 0.05),
                Sample({**v, "feature": "amount_eur"}, 0.25),
            ],
            catalogue.FEATURE_MISSING_RATIO.name: [Sample({**v, "feature": "amount_eur"}, 0.01)],
            catalogue.WINDOW_DECISIONS.name: [Sample({**v, "arm": "live"}, 500)],
            catalogue.LIVE_PRECISION.name: [
                Sample({**v, "threshold": "review", "maturity": "immature"}, 0.5)
            ],
            catalogue.REFERENCE_RECALL.name: [
                Sample({**v, "threshold": "review", "bound": b}, x)
                for b, x in (("low", 0.6), ("estimate", 0.7), ("high", 0.8))
            ],
            catalogue.RETRAINING_ADVISED.name: [Sample(v, 1.0)],
        }
    )
    template = pages._templates().env.get_template("models.html")
    models = read_models(tmp_path, "fraud-lgbm")
    html = template.render(models=models, quality=quality, monitor_where="the monitor")
    assert '<tr data-feature="amount_eur"><td>amount_eur</td>' in html
    assert '<span class="psi-major">0.250</span>' in html and "1.0%" in html
    assert '<tr data-maturity="immature">' in html and "0.500" in html
    assert "0.700 [0.60, 0.80]" in html and 'data-advised="true"' in html
    absent = template.render(
        models=models, quality={}, quality_problem="x is down", monitor_where="m"
    )
    assert 'id="quality-absent"' in absent and "x is down" in absent


def test_the_models_page_shows_each_rollout_step_with_its_figures(tmp_path: Path) -> None:
    from services.models.rollout import Comparison, Phase, RolloutFile, RolloutPlan, StepResult

    rollouts = RolloutFile(tmp_path, "fraud-lgbm")
    step = StepResult(
        step="canary 1%",
        at=NOW,
        passed=False,
        decisions=812,
        live_decisions=80_377,
        seconds=61.0,
        comparisons=[
            Comparison(name="error rate", passed=True, candidate=0.0, live=0.0, detail="0 vs 0"),
            Comparison(
                name="approve rate",
                passed=False,
                candidate=0.9912,
                live=0.9733,
                detail="above live by more than the 99 % margin",
            ),
        ],
    )
    plan = RolloutPlan(
        version="7",
        steps=[1, 5, 100],
        shadow_min_decisions=0,
        step_min_decisions=500,
        step_max_seconds=600,
        require_approval=True,
        requested_by="ops",
        requested_at=NOW,
        phase=Phase.CANARY,
        step=1,
        results=[step],
    )
    with rollouts.locked():
        rollouts.write(plan)
    models = read_models(tmp_path, "fraud-lgbm")
    assert models.rollout == plan
    template = pages._templates().env.get_template("models.html")
    html = template.render(models=models, quality={}, monitor_where="the monitor")
    assert '<section class="rollout" data-version="7" data-phase="canary">' in html
    assert "canary step 2 of 3 at 5%" in html and "approval required" in html
    assert '<table class="rollout-step" data-step="canary 1%" data-passed="false">' in html
    assert "812 candidate and 80377 live decisions" in html
    assert '<tr data-figure="approve rate"><td>approve rate</td><td class="num">0.9912</td>' in html
    assert "above live by more than the 99 % margin" in html

    rollouts.path.write_text("{not json")
    broken = read_models(tmp_path, "fraud-lgbm")
    assert broken.rollout is None and broken.problem and "not a rollout file" in broken.problem


def _get(app: Any, host: str, path: str = "/") -> tuple[int, str]:
    """One GET through the whole ASGI application, as the server hands it a request."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", host.encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8090),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body.decode()


@pytest.mark.parametrize(
    ("allowed", "host", "answered"),
    [
        ("127.0.0.1,localhost,::1", "127.0.0.1:8090", True),
        ("127.0.0.1,localhost,::1", "LOCALHOST:8090", True),
        ("127.0.0.1,localhost,::1", "[::1]:8090", True),
        ("127.0.0.1,localhost,::1", "attacker.example:8090", False),
        ("127.0.0.1,localhost,::1", "attacker.example", False),
        ("console.fraudmesh.svc", "console.fraudmesh.svc:8090", True),
        ("console.fraudmesh.svc", "127.0.0.1.attacker.example", False),
        ("*", "anything.example", True),
    ],
)
def test_the_console_answers_only_its_own_hosts(
    tmp_path: Path, allowed: str, host: str, answered: bool
) -> None:
    settings = ConsoleSettings(var_dir=tmp_path, prometheus_url=None, allowed_hosts=allowed)
    app = create(settings, EdgeSettings(var_dir=tmp_path))
    status, body = _get(app, host)
    if answered:
        assert status == 200, body
    else:
        assert status == 421
        assert "does not answer for host" in body and "FRAUD_CONSOLE_ALLOWED_HOSTS" in body
    # The probe answers whatever the Host (the kubelet addresses the pod by its IP).
    assert _get(app, host, "/healthz")[0] == 200
