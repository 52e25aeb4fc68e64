"""Canary routing by card, the canary watch, and each version's input in its own feature
order (pure logic)."""

from __future__ import annotations

import math
import random

import pytest

from services.domain import featurespec
from services.gateway.canary import CanaryLimits, CanaryWatch
from services.gateway.ports import Arm
from services.gateway.routing import ModelRoute, RouteTable, card_bucket
from services.gateway.validate import Transaction
from services.models.lifecycle import CANARY_BUCKETS, Canary

from .tiny_models import metadata


class _Client:
    async def score(self, vector: list[float], timeout_s: float) -> float:
        return 0.0


def _cards(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"card-{rng.getrandbits(40):010x}" for _ in range(n)]


def test_a_card_always_gets_the_same_bucket() -> None:
    # Replicas and releases must agree on every card's bucket: the values are pinned.
    assert [card_bucket(f"card-{i:06d}") for i in range(3)] == [9089, 5702, 3158]
    assert 0 <= card_bucket("") < CANARY_BUCKETS


@pytest.mark.parametrize("percent", [0.5, 5, 20, 50, 99])
def test_the_share_of_cards_matches_the_percent(percent: float) -> None:
    cards = _cards(100_000)
    cut = Canary(version="2", percent=percent).buckets
    share = sum(card_bucket(c) < cut for c in cards) / len(cards)
    assert share == pytest.approx(percent / 100, abs=0.005)


def test_raising_the_share_only_adds_cards() -> None:
    cards = _cards(20_000)
    small = {c for c in cards if card_bucket(c) < Canary(version="2", percent=5).buckets}
    large = {c for c in cards if card_bucket(c) < Canary(version="2", percent=25).buckets}
    assert small < large


def test_route_table_picks_canary_for_its_cards() -> None:
    live = ModelRoute(metadata(version="1"), _Client())
    canary = ModelRoute(metadata(version="2"), _Client())
    table = RouteTable(live=live, canary=canary, canary_buckets=2000)
    for card in _cards(2000):
        route, arm = table.pick(card)
        expected = Arm.CANARY if card_bucket(card) < 2000 else Arm.LIVE
        assert arm is expected
        assert route is (canary if expected is Arm.CANARY else live)
    assert RouteTable(live=live).pick("any")[1] is Arm.LIVE
    assert set(table.versions()) == {"1", "2"}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(**limits: float) -> tuple[CanaryWatch, _Clock]:
    clock = _Clock()
    base = {"min_calls": 50, "p99_min_calls": 100, "window_calls": 500, "window_s": 60.0}
    return CanaryWatch("2", CanaryLimits(**(base | limits)), cap_s=0.008, clock=clock), clock


def _feed(
    watch: CanaryWatch,
    route: Arm,
    n: int,
    *,
    latency_s: float = 0.002,
    fail_every: int = 0,
    decline_every: int = 0,
) -> None:
    for i in range(1, n + 1):
        failed = bool(fail_every) and i % fail_every == 0
        declined = bool(decline_every) and i % decline_every == 0
        watch.record(route, not failed, latency_s, declined)


def test_a_canary_like_live_does_not_breach() -> None:
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400, decline_every=50, fail_every=200)
    _feed(watch, Arm.CANARY, 100, decline_every=40, fail_every=100)
    assert watch.breach() is None


def test_nothing_is_judged_before_enough_calls() -> None:
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400)
    _feed(watch, Arm.CANARY, 49, decline_every=1)
    assert watch.breach() is None
    _feed(watch, Arm.CANARY, 1, decline_every=1)
    assert watch.breach() is not None


def test_a_declining_canary_breaches_on_decision_mix() -> None:
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400, decline_every=100)
    _feed(watch, Arm.CANARY, 60, decline_every=2)
    reason = watch.breach()
    assert reason is not None and "decline rate 50.0% vs live 1.0%" in reason
    assert reason.startswith("canary v2 over 60 calls")


def test_a_failing_canary_breaches_on_error_rate() -> None:
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400)
    _feed(watch, Arm.CANARY, 60, fail_every=3)
    reason = watch.breach()
    assert reason is not None and "error rate 33.3% vs live 0.0%" in reason


def test_a_few_unlucky_calls_in_a_small_window_are_noise() -> None:
    # 3 declines in 50 calls against 1% in live: 6% is above +5 points, but not beyond
    # three standard errors of the difference.
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400, decline_every=100)
    _feed(watch, Arm.CANARY, 50)
    for _ in range(3):
        watch.record(Arm.CANARY, True, 0.002, True)
    assert watch.breach() is None


def test_a_slow_canary_breaches_on_p99_once_both_arms_have_enough_calls() -> None:
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400, latency_s=0.002)
    _feed(watch, Arm.CANARY, 60, latency_s=0.007)
    assert watch.breach() is None  # p99 is not judged on 60 calls
    _feed(watch, Arm.CANARY, 60, latency_s=0.007)
    reason = watch.breach()
    assert reason is not None and "model p99 7.0 ms vs live 2.0 ms (limit 6.0 ms)" in reason


def test_live_calls_beyond_the_canary_cut_off_count_as_failures() -> None:
    # A machine slow for everyone: the canary's calls are cut off at 8 ms and fail, live's
    # merely take as long. Judged by the same yardstick, the canary is no worse.
    watch, _ = _watch()
    _feed(watch, Arm.LIVE, 400, latency_s=0.002)
    _feed(watch, Arm.LIVE, 100, latency_s=0.012)
    _feed(watch, Arm.CANARY, 80, latency_s=0.002)
    _feed(watch, Arm.CANARY, 20, latency_s=0.008, fail_every=1)
    figures = watch.figures()
    assert figures[Arm.LIVE].error_rate == pytest.approx(0.2)
    assert watch.breach() is None


def test_old_calls_leave_the_window() -> None:
    watch, clock = _watch()
    _feed(watch, Arm.LIVE, 400)
    _feed(watch, Arm.CANARY, 60, decline_every=1)
    clock.now = 61.0
    assert watch.figures()[Arm.CANARY].calls == 0
    assert watch.breach() is None


def _store() -> dict[str, float | None]:
    # Distinct values, so a value read from the wrong column shows.
    store: dict[str, float | None] = {
        name: float(i + 2) for i, name in enumerate(featurespec.STORE_FEATURES)
    }
    store["card_last_txn_s"] = 1_799_990_000.0
    store["merchant_country"] = 250.0
    store["card_amount_mean_30d"] = None
    return store


def test_each_version_gets_its_input_in_its_own_feature_order() -> None:
    tx = Transaction("t", "c", "m", 12_345, "EUR", 1_800_000_000.0, "", True)
    defaults = {name: -float(i + 1) for i, name in enumerate(featurespec.SERVABLE_FEATURES)}
    plain = ModelRoute(metadata(default_features=defaults), _Client())
    assert plain.positions is None and not plain.helpers
    computed, vector = plain.inputs(tx, _store())
    assert vector is computed and len(vector) == len(featurespec.MODEL_FEATURES)
    by_name = dict(zip(featurespec.MODEL_FEATURES, vector, strict=True))

    order = [*reversed(featurespec.MODEL_FEATURES[3:]), "merchant_country", "card_home_country"]
    own = ModelRoute(metadata(feature_order=order, default_features=defaults), _Client())
    assert own.helpers and own.order == tuple(order)
    computed, vector = own.inputs(tx, _store())
    assert len(vector) == len(order)
    expected = {
        **by_name,
        "merchant_country": 250.0,
        "card_home_country": _store()["card_home_country"],
    }
    assert vector == [expected[name] for name in order]
    # A missing value takes the version's own default, in its own place.
    assert vector[order.index("card_amount_mean_30d")] == defaults["card_amount_mean_30d"]
    # Every computed feature is still there for the rules, the ones the version skips too.
    assert computed[: len(featurespec.MODEL_FEATURES)] == vector_of(plain, tx)


def vector_of(route: ModelRoute, tx: Transaction) -> list[float]:
    """The route's input for ``tx`` on the test store."""
    return route.vector(tx, _store())


def test_a_version_that_skips_a_feature_leaves_the_rules_an_unknown_value() -> None:
    tx = Transaction("t", "c", "m", 12_345, "EUR", 1_800_000_000.0, "", True)
    order = list(featurespec.MODEL_FEATURES[1:])
    defaults = dict.fromkeys(order, 0.0)
    route = ModelRoute(metadata(feature_order=order, default_features=defaults), _Client())
    computed, vector = route.inputs(tx, {})
    assert len(vector) == len(order) and vector == computed[1:]
    # The skipped feature has no default of this version: unknown, so no rule fires on it.
    assert math.isnan(computed[0])


def test_a_version_that_needs_a_feature_nobody_produces_is_refused_by_name() -> None:
    order = [*featurespec.MODEL_FEATURES, "shoe_size", "moon_phase"]
    defaults = dict.fromkeys(order, 0.0)
    with pytest.raises(featurespec.UnservableFeatures) as caught:
        ModelRoute(metadata(feature_order=order, default_features=defaults), _Client())
    assert caught.value.names == ["shoe_size", "moon_phase"]
    assert "'shoe_size', 'moon_phase'" in str(caught.value)


def test_missing_inputs_are_named_in_the_versions_own_order() -> None:
    store = _store()
    order = ["merchant_country", "card_amount_mean_30d", "amount_eur", "card_home_country"]
    positions = featurespec.input_positions(order)
    assert positions is not None
    store["card_home_country"] = None
    # card_amount_mean_30d is missing in the store, card_home_country too; amount_eur never.
    assert featurespec.missing_inputs(positions, store, 10.0) == [1, 3]
    assert featurespec.missing_inputs(None, store, 10.0) == featurespec.missing_features(
        store, 10.0
    )


def test_a_trained_order_route_builds_its_input_by_name() -> None:
    # The order ``fraudmesh train --feature merchant_country`` publishes: the default inputs,
    # then the added one.
    tx = Transaction("t", "c", "m", 12_345, "EUR", 1_800_000_000.0, "", True)
    order = list(featurespec.trained_order(("merchant_country",)))
    defaults = {name: -float(i + 1) for i, name in enumerate(order)}
    route = ModelRoute(metadata(feature_order=order, default_features=defaults), _Client())
    assert route.helpers and route.positions is not None
    computed, vector = route.inputs(tx, _store())
    named = dict(zip(featurespec.SERVABLE_FEATURES, computed, strict=True))
    assert vector == [named[name] for name in order]
    # The added feature is the store's value, last; the rest is the default order's vector.
    assert vector[-1] == 250.0 and order[-1] == "merchant_country"
    plain = ModelRoute(metadata(default_features=defaults), _Client())
    assert vector[:-1] == vector_of(plain, tx)
    # Its default when the store has no value, in its own place.
    assert route.vector(tx, {**_store(), "merchant_country": None})[-1] == defaults[order[-1]]
    # Any other placement of the same values is another input: the column by name decides.
    assert vector != [named[name] for name in ["merchant_country", *order[:-1]]]
