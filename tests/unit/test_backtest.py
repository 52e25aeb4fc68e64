"""Backtests of a policy: each logged payment replayed as the gateway would have answered it,
each rule and the whole policy tallied; and ``fraudmesh rules backtest`` over a decision log,
with one-line errors (exit 2) for a bad policy, an empty log and a log without outcomes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fraud.v1 import outcomes_pb2, scoring_pb2
from services.cli.main import app
from services.decisionlog import payments as logged
from services.domain import backtest, featurespec, money
from services.domain import policy as policy_domain
from services.domain.backtest import LoggedPayment

from .test_decisionlog import decision, outcome, write_flush

runner = CliRunner()

POLICY = """
rules:
  - name: big-cnp
    action: decline
    priority: 5
    when: {channel: card_not_present, amount_eur: {gt: 1000}}
  - name: busy-card
    action: review
    when: {features: {card_txn_count_1h: {gte: 3}}}
  - name: watch-gbp
    action: review
    mode: shadow
    when: {currency: [GBP]}
thresholds:
  - merchants: [merch-strict]
    review: 0.2
    decline: 0.6
"""


def _payment(tx: str, **fields: object) -> LoggedPayment:
    base: dict[str, object] = {
        "transaction_id": tx,
        "card_id": "card-1",
        "merchant_id": "merch-00001",
        "terminal_id": "term-1",
        "amount_minor": 10_000,
        "currency": "EUR",
        "card_not_present": False,
        "features": {"card_txn_count_1h": 0.0},
        "outcome": "legitimate",
        "decision": "approve",
        "score": 0.01,
        "scored_by": "model",
        "model_version": "fraud-lgbm/1",
    }
    return LoggedPayment(**(base | fields))  # type: ignore[arg-type]


def _policy() -> policy_domain.Policy:
    return policy_domain.load(POLICY, "7")


ROWS = [
    _payment("a", card_not_present=True, amount_minor=200_000, outcome="fraud"),
    _payment("b", card_not_present=True, amount_minor=150_000, decision="review", score=0.5),
    _payment("c", features={"card_txn_count_1h": 4.0}, outcome="fraud", decision="decline"),
    _payment("d", currency="GBP", amount_minor=5_000, outcome=None),
    _payment("e", outcome="fraud"),
    _payment("f", scored_by="rules", model_version="lists-3", decision="decline"),
]


def test_a_rule_decides_as_the_gateway_and_names_itself() -> None:
    replayed = {r.transaction_id: r for r in backtest.backtest(_policy(), ROWS).replayed}
    assert (replayed["a"].decision, replayed["a"].rule) == ("decline", "big-cnp")
    assert (replayed["c"].decision, replayed["c"].rule) == ("review", "busy-card")
    assert (replayed["e"].decision, replayed["e"].why) == ("approve", "as logged")
    assert replayed["d"].shadow_rules == ("watch-gbp=review",)
    # A list answered before any rule was asked: its answer stands, no shadow rule noted.
    assert (replayed["f"].decision, replayed["f"].why, replayed["f"].shadow_rules) == (
        "decline",
        "list",
        (),
    )


def test_each_rule_is_tallied_with_counts_amounts_precision_and_recall() -> None:
    report = backtest.backtest(_policy(), ROWS)
    rules = {r.name: r.figures for r in report.rules}
    big = rules["big-cnp"]
    assert big.fires.count == 2
    assert big.fires.amount_eur == money.amount_eur(200_000, "EUR") + money.amount_eur(
        150_000, "EUR"
    )
    assert (big.frauds.count, big.goods.count) == (1, 1)
    assert big.precision == 0.5
    frauds = [r for r in ROWS if r.outcome == "fraud"]
    assert big.recall == 1 / len(frauds)
    # b was already held by the model; a was approved: a fraud the rule adds.
    assert (big.overlap.count, big.new_frauds.count) == (1, 1)
    busy = rules["busy-card"]
    assert (busy.fires.count, busy.frauds.count, busy.overlap.count) == (1, 1, 1)
    assert rules["watch-gbp"].fires.count == 1 and rules["watch-gbp"].precision is None
    assert report.unlabelled == sum(1 for r in ROWS if r.outcome is None)
    # The whole policy holds a, b, c and f; as logged, b, c and f were held.
    assert (report.policy.fires.count, report.logged.fires.count) == (4, 3)
    # a approve -> decline, b review -> decline (big-cnp first), c decline -> review.
    assert report.policy.frauds.count == 2 and report.changed == 3


def test_a_merchants_own_thresholds_decide_on_the_logged_score() -> None:
    rows = [
        _payment("s1", merchant_id="merch-strict", score=0.3),
        _payment("s2", merchant_id="merch-strict", score=0.7),
        _payment("s3", merchant_id="merch-strict", score=0.1),
    ]
    decided = [r.decision for r in backtest.backtest(_policy(), rows).replayed]
    assert decided == ["review", "decline", "approve"]


def test_what_the_log_cannot_tell_is_unresolved() -> None:
    rows = [
        # A rule of the policy live then decided: no model score to fall back on.
        _payment("r", scored_by="rules", model_version="policy-6", decision="decline"),
        # The first stage approved where this policy's thresholds would have asked the model.
        _payment("q", merchant_id="merch-strict", scored_by="first_stage"),
    ]
    report = backtest.backtest(_policy(), rows)
    assert [r.decision for r in report.replayed] == [None, None]
    assert report.unresolved == 2 and report.changed == 0


def _log(root: Path, *, outcomes: bool = True) -> None:
    """Three decisions, one of them a card-not-present payment of 2,000 EUR, and outcomes."""
    names = featurespec.MODEL_FEATURES
    vector = [0.0] * len(names)
    envelopes = [decision(f"e{i}", f"t{i}", features=vector) for i in range(3)]
    big = envelopes[0].decision
    big.card_not_present, big.amount_minor = True, 200_000
    big.decision = scoring_pb2.DECISION_APPROVE
    big.shadow_rules.append("watch-gbp=review")
    if outcomes:
        envelopes += [outcome("o0", "t0"), outcome("o1", "t1", outcomes_pb2.OUTCOME_LEGITIMATE)]
    write_flush(root, 1, envelopes)


def _backtest(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    policy = tmp_path / "candidate.yaml"
    if not policy.exists():
        policy.write_text(POLICY)
    result = runner.invoke(
        app, ["rules", "backtest", *args], env={"COLUMNS": "200"}, catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def test_the_command_backtests_a_file_over_the_decision_log(tmp_path: Path) -> None:
    root = tmp_path / "decisions"
    _log(root)
    policy = tmp_path / "candidate.yaml"
    policy.write_text(POLICY)
    code, out, err = _backtest(tmp_path, str(policy), "--log-root", str(root), "--json")
    assert code == 0, err
    log = json.loads(out)["log"]
    assert log["payments"] == 3 and log["frauds"]["count"] == 1
    big = next(r for r in log["rules"] if r["name"] == "big-cnp")
    assert (big["fires"]["count"], big["frauds"]["count"], big["new_frauds"]["count"]) == (1, 1, 1)
    assert big["fires"]["amount_eur"] == money.amount_eur(200_000, "EUR")
    assert {d["transaction_id"]: d["decision"] for d in log["decisions"]}["t0"] == "decline"
    code, table, err = _backtest(tmp_path, str(policy), "--log-root", str(root))
    assert code == 0 and "big-cnp" in table and "(policy: held)" in table


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    action: explode\n")
    good = tmp_path / "good.yaml"
    good.write_text(POLICY)
    empty, no_outcomes = tmp_path / "empty", tmp_path / "no-outcomes"
    empty.mkdir()
    _log(no_outcomes, outcomes=False)
    cases = {
        "rule 'x', field 'action'": [str(bad), "--log-root", str(no_outcomes)],
        "no decision": [str(good), "--log-root", str(empty)],
        "no outcome": [str(good), "--log-root", str(no_outcomes)],
        "no policy file": ["99", "--log-root", str(no_outcomes), "--policy-dir", str(empty)],
    }
    for expected, args in cases.items():
        code, _, err = _backtest(tmp_path, *args)
        assert code == 2, (expected, err)
        assert expected in err and len(err.strip().splitlines()) == 1, err


def test_the_decision_log_keeps_the_shadow_rules(tmp_path: Path) -> None:
    root = tmp_path / "decisions"
    _log(root)
    payments, _ = logged.from_log(root)
    by_id = {p.transaction_id: p for p in payments}
    assert by_id["t0"].shadow_rules == ("watch-gbp=review",)
    assert set(by_id["t0"].features) == set(featurespec.MODEL_FEATURES)
