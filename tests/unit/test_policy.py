"""The fraud team's policy: parsing (every error names the rule and the field), hostile
YAML, evaluation, and the versioned store (publish, promote, rollback, history)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.domain import featurespec
from services.domain import policy as P
from services.models.policies import CorruptPolicyState, PolicyStore

CNP = """
rules:
  - name: cnp-over-5000-at-m
    action: decline
    priority: 10
    reason: card not present over 5,000 EUR at merchant M
    scope: {merchants: [merch-00001]}
    when:
      channel: card_not_present
      amount_eur: {gt: 5000}
"""


def _pay(**changes: object) -> P.Payment:
    values: dict[str, object] = {
        "card_id": "card-411111-9",
        "merchant_id": "merch-00001",
        "terminal_id": "term-7",
        "amount_eur": 6000.0,
        "currency": "EUR",
        "card_not_present": True,
    }
    values.update(changes)
    return P.Payment(**values)  # type: ignore[arg-type]


def _rule(body: str) -> str:
    return f"rules:\n  - name: r1\n    action: decline\n{body}"


@pytest.mark.parametrize(
    ("text", "rule", "field"),
    [
        ("rules: [{name: a, action: nuke}]", "a", "action"),
        ("rules: [{name: a, action: decline, colour: red}]", "a", "colour"),
        ("rules: [{name: a, action: decline, priority: 1.5}]", "a", "priority"),
        ("rules: [{name: a, action: decline, priority: '3'}]", "a", "priority"),
        ("rules: [{name: a, action: decline, mode: maybe}]", "a", "mode"),
        (
            "rules: [{name: a, action: decline, when: {amount_eur: {gt: x}}}]",
            "a",
            "when.amount_eur.gt",
        ),
        (
            "rules: [{name: a, action: decline, when: {amount_eur: {gt: true}}}]",
            "a",
            "when.amount_eur.gt",
        ),
        (
            "rules: [{name: a, action: decline, when: {amount_eur: {over: 5}}}]",
            "a",
            "when.amount_eur.over",
        ),
        ("rules: [{name: a, action: decline, when: {amount_eur: {}}}]", "a", "when.amount_eur"),
        (
            "rules: [{name: a, action: decline, when: {amount_eur: {gt: .inf}}}]",
            "a",
            "when.amount_eur.gt",
        ),
        ("rules: [{name: a, action: decline, when: {channel: phone}}]", "a", "when.channel"),
        ("rules: [{name: a, action: decline, when: {currency: [euro]}}]", "a", "when.currency.0"),
        ("rules: [{name: a, action: decline, when: {merchant: m1}}]", "a", "when.merchant"),
        (
            "rules: [{name: a, action: decline, when: {features: {nope: {gt: 1}}}}]",
            "a",
            "when.features.nope",
        ),
        (
            "rules: [{name: a, action: decline, when: {features: {card_txn_count_1h: 3}}}]",
            "a",
            "when.features.card_txn_count_1h",
        ),
        ("rules: [{name: a, action: decline, scope: {merchants: []}}]", "a", "scope.merchants"),
        ("rules: [{name: a, action: decline}, {name: a, action: review}]", "a", "name"),
        ("rules: [{name: a, action: decline}, {action: review}]", "#2", "name"),
        ("rules: [{name: 'bad name!', action: decline}]", "bad name!", "name"),
        ("rules: [{name: a}]", "a", "action"),
        ("rules: [5]", "#1", "(the rule)"),
    ],
)
def test_every_error_names_the_rule_and_the_field(text: str, rule: str, field: str) -> None:
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert (raised.value.rule, raised.value.field) == (rule, field)
    assert f"rule {rule!r}, field {field!r}: " in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("rules: 3", "rules"),
        ("- a\n- b", "rules"),
        ("format: 2\nrules: []", "format"),
        ("rules: []\nowner: me", "owner"),
        ("", "rules"),
    ],
)
def test_a_wrong_document_names_the_field(text: str, field: str) -> None:
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert raised.value.rule == ""
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("x" * (P.MAX_POLICY_BYTES + 1), "larger than"),
        ("rules: " + "[" * 50 + "]" * 50, "nested deeper"),
        ("rules:\n" + "  " + "- " * 5000 + "x", "nested deeper"),
        ("a: &x [1, 2]\nrules: *x", "aliases"),
        ("rules: [\n", "not valid YAML"),
        ("rules: [{name: a, action: !!python/object:os.system x}]", "not valid YAML"),
    ],
)
def test_hostile_yaml_is_refused_in_one_line(text: str, problem: str) -> None:
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert problem in str(raised.value)
    assert "\n" not in str(raised.value)


def test_too_many_rules_are_refused() -> None:
    text = "rules:\n" + "".join(
        f"  - {{name: r{i}, action: review}}\n" for i in range(P.MAX_RULES + 1)
    )
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert raised.value.field == "rules"


def test_too_many_values_in_one_list_are_refused() -> None:
    values = ", ".join(f"m{i}" for i in range(P.MAX_VALUES + 1))
    with pytest.raises(P.PolicyError) as raised:
        P.parse(f"rules: [{{name: a, action: decline, when: {{merchant: [{values}]}}}}]")
    assert (raised.value.rule, raised.value.field) == ("a", "when.merchant")


def test_a_valid_policy_parses_with_defaults() -> None:
    spec = P.parse(CNP)
    (rule,) = spec.rules
    assert rule.action is P.Action.DECLINE and rule.mode is P.Mode.LIVE
    assert P.parse("rules: []").rules == []


def test_the_cnp_rule_fires_only_inside_its_conditions_and_scope() -> None:
    policy = P.load(CNP, "1")
    assert policy.decide(_pay(), {}) is not None
    assert policy.decide(_pay(amount_eur=5000.0), {}) is None
    assert policy.decide(_pay(card_not_present=False), {}) is None
    assert policy.decide(_pay(merchant_id="merch-00002"), {}) is None


@pytest.mark.parametrize(
    ("when", "fires", "misses"),
    [
        ("currency: [EUR, GBP]", {}, {"currency": "USD"}),
        ("channel: card_present", {"card_not_present": False}, {"card_not_present": True}),
        ("merchant: [merch-00001]", {}, {"merchant_id": "merch-9"}),
        ("terminal: [term-7]", {}, {"terminal_id": ""}),
        ("card_prefix: ['999', card-411]", {}, {"card_id": "card-5"}),
        ("amount_eur: {gte: 6000, lt: 6001}", {}, {"amount_eur": 6001.0}),
        ("amount_eur: {eq: 6000}", {}, {"amount_eur": 5999.5}),
        ("amount_eur: {lte: 6000}", {}, {"amount_eur": 6000.5}),
    ],
)
def test_each_request_condition(
    when: str, fires: dict[str, object], misses: dict[str, object]
) -> None:
    policy = P.load(_rule(f"    when:\n      {when}\n"), "1")
    assert policy.decide(_pay(**fires), {}) is not None
    assert policy.decide(_pay(**{**fires, **misses}), {}) is None


def test_a_feature_condition_reads_the_features_by_name() -> None:
    name = featurespec.CARD_FEATURES[0]
    policy = P.load(_rule(f"    when:\n      features: {{{name}: {{gte: 5}}}}\n"), "1")
    assert policy.uses_features
    assert policy.decide(_pay(), {name: 5.0}) is not None
    assert policy.decide(_pay(), {name: 4.0}) is None
    # A feature nobody computed never fires a rule.
    assert policy.decide(_pay(), {}) is None
    assert not P.load(CNP, "1").uses_features


def test_highest_priority_decides_then_the_order_written() -> None:
    text = """
rules:
  - {name: low, action: approve, priority: 1}
  - {name: first-high, action: review, priority: 5}
  - {name: second-high, action: decline, priority: 5}
"""
    policy = P.load(text, "4")
    decided = policy.decide(_pay(), {})
    assert decided is not None and decided.name == "first-high"
    assert [r.name for r in policy.live] == ["first-high", "second-high", "low"]


def test_scoped_and_global_rules_keep_one_order() -> None:
    text = """
rules:
  - {name: global-low, action: review, priority: 1}
  - {name: mine-high, action: decline, priority: 5, scope: {merchants: [merch-00001]}}
  - {name: mine-low, action: approve, priority: 0, scope: {merchants: [merch-00001]}}
  - {name: theirs, action: decline, priority: 9, scope: {merchants: [merch-00002]}}
  - {name: shadow-mine, action: decline, mode: shadow, priority: 3, scope: {merchants: [merch-00001]}}
  - {name: shadow-all, action: review, mode: shadow, priority: 4}
"""
    policy = P.load(text, "1")
    mine = policy.decide(_pay(), {})
    assert mine is not None and mine.name == "mine-high"
    other = policy.decide(_pay(merchant_id="merch-00003"), {})
    assert other is not None and other.name == "global-low"
    theirs = policy.decide(_pay(merchant_id="merch-00002"), {})
    assert theirs is not None and theirs.name == "theirs"
    low = P.load(text.replace("priority: 5", "priority: -1"), "2").decide(_pay(), {})
    assert low is not None and low.name == "global-low"
    assert policy.shadowed(_pay(), {}) == ("shadow-all=review", "shadow-mine=decline")
    assert policy.shadowed(_pay(merchant_id="x"), {}) == ("shadow-all=review",)


def test_shadow_rules_never_decide_and_say_what_they_would_do() -> None:
    text = """
rules:
  - {name: would-decline, action: decline, mode: shadow, when: {amount_eur: {gt: 100}}}
  - {name: would-approve, action: approve, mode: shadow, when: {amount_eur: {lt: 100}}}
  - {name: quiet, action: review, mode: shadow, priority: 9, when: {currency: [JPY]}}
"""
    policy = P.load(text, "2")
    assert policy.decide(_pay(), {}) is None
    assert policy.shadowed(_pay(), {}) == ("would-decline=decline",)
    assert policy.shadowed(_pay(amount_eur=1.0), {}) == ("would-approve=approve",)


def test_an_empty_when_fires_on_every_payment() -> None:
    policy = P.load("rules: [{name: all, action: review}]", "1")
    rule = policy.decide(_pay(), {})
    assert rule is not None and rule.reason == "review by rule all"


# The store ---------------------------------------------------------------------------------


def test_publish_promote_rollback_keep_history(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    assert store.live() is None and store.file_key() is None
    assert store.publish(CNP) == "1"
    assert store.read_state().live is None
    assert store.publish(CNP.replace("5000", "7000")) == "2"
    store.promote("1")
    live = store.live()
    assert live is not None and live.version == "1"
    store.promote("2")
    assert [(v.version, v.state) for v in store.listing()] == [("2", "live"), ("1", "previous")]
    store.rollback()
    assert store.read_state().live == "1"
    store.rollback()
    assert store.live() is None
    with pytest.raises(FailedPrecondition):
        store.rollback()
    actions = [(c.action, c.version) for c in store.read_state().history]
    assert actions == [
        ("publish", "1"),
        ("publish", "2"),
        ("promote", "1"),
        ("promote", "2"),
        ("rollback", "1"),
        ("rollback", None),
    ]
    assert store.text("2") == CNP.replace("5000", "7000")


def test_a_bad_policy_changes_nothing(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    store.publish(CNP)
    store.promote("1")
    before = (store.file_key(), store.published())
    with pytest.raises(P.PolicyError):
        store.publish("rules: [{name: a, action: nuke}]")
    assert (store.file_key(), store.published()) == before


def test_unknown_or_malformed_versions_are_refused(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    with pytest.raises(NotFound):
        store.promote("3")
    for bad in ("../1", "-1", "1.yaml", "", "9" * 20):
        with pytest.raises(InvalidArgument):
            store.text(bad)
    store.publish(CNP)
    store.promote("1")
    with pytest.raises(FailedPrecondition):
        store.promote("1")


def test_a_corrupt_state_file_is_named(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    store.publish(CNP)
    store.state_path.write_text(json.dumps({"live": 3, "extra": True}))
    with pytest.raises(CorruptPolicyState):
        store.read_state()


def test_every_write_changes_the_file_key(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "policy")
    store.publish(CNP)
    first = store.file_key()
    store.promote("1")
    assert store.file_key() not in (None, first)


# -- merchant categories ------------------------------------------------------------------------

GROCERY, JEWELLERY = 5411.0, 5944.0


def test_a_category_scope_applies_where_the_merchants_category_is_listed() -> None:
    text = """
rules:
  - {name: jewellery, action: review, scope: {categories: [5944]}, when: {amount_eur: {gt: 1000}}}
  - {name: both, action: decline, priority: 5, scope: {merchants: [merch-00009], categories: [7995]}}
"""
    policy = P.load(text, "1")
    assert policy.uses_features  # the category is the store's, read with the features
    fired = policy.decide(_pay(), {P.CATEGORY_FEATURE: JEWELLERY})
    assert fired is not None and fired.name == "jewellery"
    assert policy.decide(_pay(), {P.CATEGORY_FEATURE: GROCERY}) is None
    # No category known for the call (default features): a category scope does not apply.
    assert policy.decide(_pay(), {}) is None
    # Merchants and categories together: a listed merchant, or a listed category.
    listed = policy.decide(_pay(merchant_id="merch-00009"), {P.CATEGORY_FEATURE: GROCERY})
    assert listed is not None and listed.name == "both"
    gambling = policy.decide(_pay(merchant_id="merch-00002"), {P.CATEGORY_FEATURE: 7995.0})
    assert gambling is not None and gambling.name == "both"


def test_thresholds_by_category_and_a_merchants_own_first() -> None:
    text = """
thresholds:
  - {categories: [5944], review: 0.2, decline: 0.5}
  - {merchants: [merch-00001], review: 0.4, decline: 0.9}
"""
    policy = P.load(text, "1")
    jewellery = {P.CATEGORY_FEATURE: JEWELLERY}
    assert policy.thresholds_for("merch-00002", jewellery) == (0.2, 0.5)
    assert policy.thresholds_for("merch-00001", jewellery) == (0.4, 0.9)
    assert policy.thresholds_for("merch-00002", {P.CATEGORY_FEATURE: GROCERY}) is None
    assert policy.thresholds_for("merch-00002", {}) is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("rules: [{name: a, action: decline, scope: {}}]", "scope"),
        ("rules: [{name: a, action: decline, scope: {categories: [10000]}}]", "scope.categories.0"),
        (
            "rules: [{name: a, action: decline, scope: {categories: ['5411']}}]",
            "scope.categories.0",
        ),
        ("rules: [{name: a, action: decline, scope: {categories: []}}]", "scope.categories"),
    ],
)
def test_a_bad_category_scope_names_the_field(text: str, field: str) -> None:
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert (raised.value.rule, raised.value.field) == ("a", field)


def test_a_category_with_two_thresholds_is_refused() -> None:
    text = """
thresholds:
  - {categories: [5944], review: 0.2, decline: 0.5}
  - {categories: [5411, 5944], review: 0.3, decline: 0.6}
"""
    with pytest.raises(P.PolicyError) as raised:
        P.parse(text)
    assert raised.value.field == "thresholds.1.categories"
    assert "5944 has thresholds already" in str(raised.value)
