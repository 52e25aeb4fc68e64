"""The fraud team's policy on the ladder's first rung: answers a rule decides name it, shadow
rules reach the decision event, no policy changes nothing, and a change in the store is
followed at run time (pure logic, no servers)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fraud.v1 import scoring_pb2 as pb
from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain import policy as P
from services.gateway.budget import Budget
from services.gateway.controls import PolicyControl, PolicyFollower
from services.gateway.events import decision_event
from services.gateway.pipeline import Decision, Pipeline, ScoredBy, ScoreResult
from services.gateway.validate import Transaction
from services.models.policies import PolicyStore

from .test_cascade import Model as CascadeModel
from .test_cascade import Small, _tx
from .test_cascade import _pipeline as cascade_pipeline
from .test_pipeline import NOW, POLICY, TX, Features, Model, _pipeline, _store

CNP = """
rules:
  - name: cnp-over-5000-at-m
    action: decline
    priority: 10
    reason: card not present over 5,000 EUR at merchant M
    scope: {merchants: [m]}
    when: {channel: card_not_present, amount_eur: {gt: 5000}}
  - name: watch-velocity
    action: review
    mode: shadow
    when: {features: {card_txn_count_1h: {gte: 1}}}
"""

BIG_CNP = replace(TX, amount_minor=600_000, card_not_present=True)


def _with(control: PolicyControl, model: Model) -> Pipeline:
    pipeline = _pipeline(Features(_store()), model)
    pipeline.controls = (control,)
    return pipeline


async def test_a_live_rule_decides_before_the_model_and_is_named() -> None:
    model = Model(0.05)
    control = PolicyControl(P.load(CNP, "3"))
    result = await _with(control, model).score(BIG_CNP, Budget(POLICY, None))
    assert result.decision is Decision.DECLINE
    assert result.scored_by is ScoredBy.RULES
    assert result.model_version == "policy-3"
    assert result.reasons[0] == (
        "rule cnp-over-5000-at-m: card not present over 5,000 EUR at merchant M"
    )
    assert result.score == P.ACTION_SCORE[P.Action.DECLINE]
    assert model.calls == 0
    # The shadow rule fired too (the store says one payment in the last hour) and is noted.
    assert result.shadow_rules == ("watch-velocity=review",)


async def test_a_payment_no_live_rule_fires_goes_on_to_the_model() -> None:
    model = Model(0.05)
    control = PolicyControl(P.load(CNP, "3"))
    result = await _with(control, model).score(TX, Budget(POLICY, None))
    assert result.scored_by is ScoredBy.MODEL and result.model_version == "3"
    assert model.calls == 1
    # A shadow rule is recorded whoever answers, and never changes the answer.
    assert result.shadow_rules == ("watch-velocity=review",)
    plain = await _pipeline(Features(_store()), Model(0.05)).score(TX, Budget(POLICY, None))
    assert (result.decision, result.score, result.reasons) == (
        plain.decision,
        plain.score,
        plain.reasons,
    )


@pytest.mark.parametrize("tx", [TX, BIG_CNP])
async def test_no_policy_answers_as_without_controls(tx: Transaction) -> None:
    without = await _pipeline(Features(_store()), Model(0.5)).score(tx, Budget(POLICY, None))
    with_empty = await _with(PolicyControl(), Model(0.5)).score(tx, Budget(POLICY, None))
    assert (with_empty.decision, with_empty.score, with_empty.reasons) == (
        without.decision,
        without.score,
        without.reasons,
    )
    assert with_empty.model_version == without.model_version
    assert with_empty.shadow_rules == ()


def test_the_decision_event_carries_the_shadow_rules() -> None:
    request = pb.ScoreRequest(transaction_id="t", card_id="c", merchant_id="m", currency="EUR")
    request.timestamp.FromSeconds(int(NOW))
    response = pb.ScoreResponse(transaction_id="t", decision=pb.DECISION_APPROVE)
    result = _answered(("watch-velocity=review", "other=decline"))
    envelope = decision_event(request, False, result, response, NOW, "schema")
    assert list(envelope.decision.shadow_rules) == ["watch-velocity=review", "other=decline"]
    quiet = decision_event(request, False, _answered(()), response, NOW, "schema")
    assert list(quiet.decision.shadow_rules) == []


def _answered(shadow_rules: tuple[str, ...]) -> ScoreResult:
    return ScoreResult(
        Decision.APPROVE,
        0.1,
        feature_order=featurespec.MODEL_FEATURES,
        shadow_rules=shadow_rules,
    )


async def test_the_follower_applies_promote_and_rollback_at_run_time(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    control = PolicyControl()
    follower = PolicyFollower(store, control, poll_s=0.01)
    follower.load()
    assert control.policy is None
    store.publish(CNP)
    await follower.check()
    assert control.policy is None  # published, not live
    store.promote("1")
    await follower.check()
    assert control.policy is not None and control.policy.version == "1"
    kept = control.policy
    await follower.check()
    assert control.policy is kept  # unchanged file: nothing read, nothing rebuilt
    store.rollback()
    await follower.check()
    assert control.policy is None


async def test_an_unreadable_change_keeps_the_live_policy(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    store.publish(CNP)
    store.promote("1")
    control = PolicyControl()
    follower = PolicyFollower(store, control, poll_s=0.01)
    follower.load()
    store.state_path.write_text("{not json")
    with pytest.raises(FailedPrecondition):
        await follower.check()
    assert control.policy is not None and control.policy.version == "1"
    with pytest.raises(FailedPrecondition):
        PolicyFollower(store, PolicyControl(), poll_s=0.01).load()


THRESHOLDS = """
thresholds:
  - merchants: [m]
    review: 0.1
    decline: 0.4
"""


@pytest.mark.parametrize(
    ("score", "own", "default"),
    [
        (0.05, Decision.APPROVE, Decision.APPROVE),
        (0.2, Decision.REVIEW, Decision.APPROVE),
        (0.5, Decision.DECLINE, Decision.REVIEW),
        (0.9, Decision.DECLINE, Decision.DECLINE),
    ],
)
async def test_a_merchants_thresholds_change_that_merchants_decisions_only(
    score: float, own: Decision, default: Decision
) -> None:
    control = PolicyControl(P.load(THRESHOLDS, "5"))
    mine = await _with(control, Model(score)).score(TX, Budget(POLICY, None))
    other = replace(TX, merchant_id="another")
    theirs = await _with(control, Model(score)).score(other, Budget(POLICY, None))
    assert (mine.decision, theirs.decision) == (own, default)
    assert mine.scored_by is ScoredBy.MODEL and mine.model_version == "3"
    assert "the merchant's own thresholds (policy-5)" in mine.reasons
    assert not any("own thresholds" in r for r in theirs.reasons)


def test_threshold_errors_name_the_field() -> None:
    cases = {
        "thresholds: [{merchants: [m], review: 0.7, decline: 0.6}]": "thresholds.0.review",
        "thresholds: [{merchants: [m], review: 0.1, decline: 1.5}]": "thresholds.0.decline",
        "thresholds: [{merchants: [m], review: '0.1', decline: 0.5}]": "thresholds.0.review",
        "thresholds: [{merchants: [], review: 0.1, decline: 0.5}]": "thresholds.0.merchants",
        "thresholds: [{merchants: [m], review: 0.1, decline: 0.5, colour: 1}]": "thresholds.0.colour",
        (
            "thresholds: [{merchants: [m], review: 0.1, decline: 0.6},"
            " {merchants: [n, m], review: 0.1, decline: 0.2}]"
        ): "thresholds.1.merchants",
    }
    for text, field in cases.items():
        with pytest.raises(P.PolicyError) as raised:
            P.parse(text)
        assert raised.value.field == field, text


async def test_a_merchant_held_below_clear_approve_skips_the_first_stage() -> None:

    # The live version's small model clear-approves below 0.05.
    strict = PolicyControl(
        P.load("thresholds: [{merchants: [m], review: 0.02, decline: 0.5}]", "6")
    )
    loose = PolicyControl(P.load("thresholds: [{merchants: [m], review: 0.2, decline: 0.5}]", "7"))
    for control, scored_by in ((strict, ScoredBy.MODEL), (loose, ScoredBy.FIRST_STAGE)):
        model = CascadeModel(0.03)
        pipeline = cascade_pipeline(model, Small(0.01))
        pipeline.controls = (control,)
        result = await pipeline.score(_tx(), Budget(POLICY, None))
        assert result.scored_by is scored_by
        if control is strict:
            # The model's 0.03 is over the strict merchant's review threshold.
            assert result.decision is Decision.REVIEW and model.calls == 1


async def test_a_categorys_thresholds_follow_the_merchants_category_in_the_store() -> None:
    control = PolicyControl(
        P.load("thresholds: [{categories: [5944], review: 0.1, decline: 0.4}]", "6")
    )

    async def decided(category: float) -> ScoreResult:
        pipeline = _pipeline(Features(_store(merchant_category=category)), Model(0.5))
        pipeline.controls = (control,)
        return await pipeline.score(TX, Budget(POLICY, None))

    jewellery, grocery = await decided(5944.0), await decided(5411.0)
    # 0.5 declines on the category's thresholds; on the model's own it is a review.
    assert (jewellery.decision, grocery.decision) == (Decision.DECLINE, Decision.REVIEW)
    assert "the merchant's own thresholds (policy-6)" in jewellery.reasons
    assert not any("own thresholds" in r for r in grocery.reasons)
