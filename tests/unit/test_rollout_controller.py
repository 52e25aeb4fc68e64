"""The rollout controller: each step's comparisons (both directions, with margins for the
window's size), and a rollout carried through the lifecycle file: advanced, rolled back with
the figures, promoted or held for approval, and resumed by a new controller."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from services.models.lifecycle import ModelLifecycle, VersionState
from services.models.rollout import (
    Comparison,
    Phase,
    RolloutEnd,
    RolloutFile,
    RolloutPlan,
    check_steps,
)
from services.monitor import tally
from services.monitor.controller import (
    RolloutController,
    RolloutPolicy,
    compare_rate,
    judge_canary,
    judge_shadow,
)
from services.monitor.evaluation import Figures
from services.monitor.tally import Layout, Scored, Tally

from .tiny_models import onnx_model, publish

POLICY = RolloutPolicy()


def arm(
    n: int,
    seed: int,
    review: float = 0.3,
    decline: float = 0.8,
    power: float = 1.0,
    latency_ms: float = 4.0,
    shadow_of: tuple[float, float] | None = None,
) -> Tally:
    """A window of ``n`` answers: scores from one distribution (raised to ``power``: the same
    ranking on another scale), decided at the thresholds."""
    rng = np.random.default_rng(seed)
    base = rng.beta(0.6, 4.0, size=n)
    scores = base**power
    decisions = np.where(scores >= decline, 2, np.where(scores >= review, 1, 0))
    answered = None
    if shadow_of is not None:
        answered = np.where(base >= shadow_of[1], 2, np.where(base >= shadow_of[0], 1, 0))
    out = Tally()
    tally.count(
        Layout.of(None),
        Scored(
            scores=scores,
            decisions=decisions,
            rules=np.zeros(n, dtype=bool),
            sources=np.zeros(n, dtype=np.int64),
            latency_ms=rng.uniform(latency_ms * 0.5, latency_ms * 1.5, size=n),
            answered=answered,
        ),
        out,
    )
    return out


def _failed(result: list[Comparison]) -> list[str]:
    return [c.name for c in result if not c.passed]


def test_a_canary_like_live_passes_every_comparison() -> None:
    assert _failed(judge_canary(arm(400, 1), arm(4000, 2), Tally(), POLICY)) == []


def test_higher_thresholds_fail_on_the_decision_rates_in_both_directions() -> None:
    failed = _failed(judge_canary(arm(400, 1, 0.7, 0.95), arm(4000, 2), Tally(), POLICY))
    # It approves what live reviews: approve rises, review falls.
    assert "approve rate" in failed and "review rate" in failed


def test_shifted_scores_fail_on_the_score_psi() -> None:
    failed = _failed(judge_canary(arm(400, 1, power=0.5), arm(4000, 2), Tally(), POLICY))
    assert "score PSI" in failed


def test_failures_and_late_answers_of_the_canary_fail() -> None:
    canary = arm(400, 1)
    canary.failed, canary.timed_out = 40, 30
    assert _failed(judge_canary(canary, arm(4000, 2), Tally(), POLICY)) == ["errors and timeouts"]
    slow = arm(400, 1, latency_ms=40.0)
    assert _failed(judge_canary(slow, arm(4000, 2), Tally(), POLICY)) == ["p99"]


def test_a_small_window_is_judged_with_its_noise() -> None:
    # 40 decisions: a real difference of a few points is within the noise, not a breach.
    assert _failed(judge_canary(arm(40, 3, 0.33, 0.82), arm(4000, 2), Tally(), POLICY)) == []


def test_matured_labels_compare_precision_and_recall() -> None:
    from services.domain.metrics import wilson_interval

    def figures(caught: int) -> Figures:
        recall = wilson_interval(caught, 200)
        precision = wilson_interval(caught, caught + 50)
        return Figures(10_000, 10_000, 200, {"review": precision, "decline": precision},
                       {"review": recall, "decline": recall}, 0.5)  # fmt: skip

    failed = _failed(
        judge_canary(arm(400, 1), arm(4000, 2), Tally(), POLICY, figures(60), figures(150))
    )
    assert "recall at review" in failed
    fine = judge_canary(arm(400, 1), arm(4000, 2), Tally(), POLICY, figures(148), figures(150))
    assert _failed(fine) == []


def test_the_shadow_gate_names_agreement_and_psi() -> None:
    live = arm(2000, 5)
    good = arm(2000, 5, shadow_of=(0.3, 0.8))
    assert _failed(judge_shadow(good, live, POLICY)) == []
    shifted = arm(2000, 5, power=0.5, shadow_of=(0.3, 0.8))
    failed = _failed(judge_shadow(shifted, live, POLICY))
    assert "score PSI" in failed and "decision agreement" in failed


def test_steps_must_increase_and_end_at_100() -> None:
    assert check_steps([1, 5, 100]) is None
    assert check_steps([5, 1, 100]) == "shares must increase"
    assert check_steps([1, 5]) == "the last step must be 100 (the promotion)"
    assert check_steps([0, 100]) == "0 is not a share from 0.01 to 100"


class FakeEngine:
    """Windows handed out by version and arm (pure logic under test: the controller)."""

    def __init__(self) -> None:
        self.windows: dict[tuple[str, str], Tally] = {}
        """Counts in every window, whatever its start."""
        self.slices: list[tuple[str, str, float, Tally]] = []
        """Counts of a slice (version, arm, its start), in the windows that start by then."""

    def window(
        self,
        version: str,
        arms: Sequence[str] = ("live",),
        since_s: float | None = None,
        until_s: float | None = None,
    ) -> Tally:
        timed = [
            counts
            for v, a, start, counts in self.slices
            if v == version and a in arms and (since_s is None or start >= since_s)
        ]
        return tally.merged([*(self.windows.get((version, a), Tally()) for a in arms), *timed])

    def versions(self, since_s: float, arms: Sequence[str] = ("live",)) -> set[str]:
        return {v for v, a in self.windows if a in arms}

    def evaluation(self, version: str, now_s: float | None = None) -> dict[str, Figures]:
        from services.monitor.evaluation import Cohort, figures

        return {"matured": figures(Cohort(), True)}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 6, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ModelLifecycle, RolloutFile, str]:
    root = tmp_path / "models"
    model = onnx_model(tmp_path / "m.onnx", trees=3)
    publish(root, model, candidate=False)  # v1: live
    version = publish(root, model)
    return ModelLifecycle(root), RolloutFile(root), version


def _plan(version: str, **changes: object) -> RolloutPlan:
    fields: dict[str, object] = {
        "version": version,
        "steps": [10.0, 50.0, 100.0],
        "shadow_min_decisions": 0,
        "step_min_decisions": 300,
        "step_max_seconds": 60.0,
        "require_approval": False,
        "requested_by": "test",
        "requested_at": datetime(2026, 6, 1, tzinfo=UTC),
        "phase": Phase.CANARY,
    }
    fields.update(changes)
    return RolloutPlan.model_validate(fields)


def _controller(
    lifecycle: ModelLifecycle, plans: RolloutFile, engine: FakeEngine, clock: Clock
) -> RolloutController:
    return RolloutController(engine, lifecycle, plans, slice_s=1, clock=clock)


def test_a_good_candidate_is_promoted_step_by_step_and_resumes_after_a_restart(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    lifecycle, plans, version = setup
    plans.write(_plan(version))
    engine, clock = FakeEngine(), Clock()
    controller = _controller(lifecycle, plans, engine, clock)
    controller.tick()
    assert lifecycle.read().routing.canary.percent == 10  # type: ignore[union-attr]
    controller.tick()  # no decisions yet: waits
    assert plans.read().step == 0  # type: ignore[union-attr]
    engine.windows = {(version, "canary"): arm(400, 1), ("1", "live"): arm(4000, 2)}
    controller.tick()  # the canary's first calls: the window starts at the next whole slice
    assert lifecycle.read().routing.canary.percent == 10  # type: ignore[union-attr]
    controller.tick()
    assert lifecycle.read().routing.canary.percent == 50  # type: ignore[union-attr]
    # A new controller (the monitor restarted) carries on from the file.
    _controller(lifecycle, plans, engine, clock).tick()
    _controller(lifecycle, plans, engine, clock).tick()
    plan = plans.read()
    assert plan is not None
    assert plan.outcome is RolloutEnd.PROMOTED, plan.reason
    state = lifecycle.read()
    assert state.routing.live == version and state.routing.previous == "1"
    reasons = [t.reason for t in state.history if t.version == version]
    assert any(r.startswith("canary 10% passed: errors and timeouts") for r in reasons)
    assert any(r.startswith("canary 50% passed") for r in reasons)
    assert reasons[-1] == "promoted: staged rollout: 2 canary steps passed"
    assert [r.step for r in plan.results] == ["canary 10%", "canary 50%"]


def test_higher_thresholds_are_rolled_back_at_the_first_step_naming_the_rates(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    lifecycle, plans, version = setup
    plans.write(_plan(version))
    engine, clock = FakeEngine(), Clock()
    controller = _controller(lifecycle, plans, engine, clock)
    controller.tick()
    engine.windows = {(version, "canary"): arm(400, 1, 0.7, 0.95), ("1", "live"): arm(4000, 2)}
    controller.tick()
    controller.tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.ROLLED_BACK
    assert plan.reason.startswith("rolled back at canary 10%: approve rate")
    record = lifecycle.read().versions[version]
    assert record.state is VersionState.RETIRED and "review rate" in record.reason
    assert lifecycle.read().routing.canary is None


def test_a_step_without_enough_traffic_rolls_back_and_approval_holds_the_last_step(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    lifecycle, plans, version = setup
    plans.write(_plan(version, require_approval=True))
    engine, clock = FakeEngine(), Clock()
    controller = _controller(lifecycle, plans, engine, clock)
    controller.tick()
    engine.windows = {(version, "canary"): arm(400, 1), ("1", "live"): arm(4000, 2)}
    for _ in range(4):  # each step: its window's start, then its verdict
        controller.tick()
    plan = plans.read()
    assert plan is not None and plan.phase is Phase.APPROVAL
    assert lifecycle.read().versions[version].state is VersionState.CANARY
    # The next rollout: too few decisions within the step's time.
    v3 = publish(lifecycle.model_root, lifecycle.folder / version / "model.onnx")
    lifecycle.promote(version)
    plans.write(_plan(v3))
    controller.tick()
    engine.windows = {(v3, "canary"): arm(50, 1), (version, "live"): arm(4000, 2)}
    controller.tick()
    clock.now += timedelta(seconds=61)
    controller.tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.ROLLED_BACK
    assert "fewer than the 300 a step needs" in plan.reason


def test_the_shadow_gate_stops_a_shifted_candidate_naming_the_psi(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    lifecycle, plans, version = setup
    plans.write(_plan(version, phase=Phase.SHADOW, shadow_min_decisions=1000))
    engine, clock = FakeEngine(), Clock()
    controller = _controller(lifecycle, plans, engine, clock)
    controller.tick()
    assert lifecycle.read().routing.shadow == version
    engine.windows = {
        (version, "shadow"): arm(2000, 5, power=0.5, shadow_of=(0.3, 0.8)),
        ("1", "live"): arm(2000, 5),
    }
    controller.tick()  # its first scores: the window starts at the next whole slice
    plan = plans.read()
    assert plan is not None and plan.window_from is not None and not plan.results
    controller.tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.SHADOW_FAILED
    assert "score PSI" in plan.reason
    assert lifecycle.read().versions[version].state is VersionState.RETIRED


def test_a_step_of_1000_decisions_resolves_the_rates_the_docs_say() -> None:
    """docs/lifecycle.md: with 1000 canary decisions against a far larger live window, a 5 %
    review rate fails the step at 8.5 % or 2.0 %, a 95 % approve rate at 98 %."""
    policy = RolloutPolicy()

    def fails(k: int, k_live: int) -> bool:
        return not compare_rate("r", k, 1000, k_live, 100_000, policy).passed

    assert fails(85, 5000) and not fails(84, 5000)
    assert fails(20, 5000) and not fails(21, 5000)
    assert fails(980, 95_000) and not fails(979, 95_000)


def test_a_canary_step_judges_live_from_when_the_split_was_in_force(
    setup: tuple[ModelLifecycle, RolloutFile, str],
) -> None:
    # The step starts mid-slice and the gateways follow the routing a poll later: live's
    # calls of that slice came before the split. On traffic whose scores move (cards calling
    # again and again), they part two arms that serve the very same model.
    lifecycle, plans, version = setup
    plans.write(_plan(version, steps=[50.0, 100.0]))
    engine, clock = FakeEngine(), Clock()
    clock.now += timedelta(seconds=0.4)
    controller = _controller(lifecycle, plans, engine, clock)
    controller.tick()  # the step starts
    started = clock.now.timestamp() // 1
    engine.slices = [
        ("1", "live", started, arm(2000, 7, power=0.4)),  # before the split
        (version, "canary", started, arm(20, 8)),  # its first calls
    ]
    clock.now += timedelta(seconds=0.3)
    controller.tick()
    plan = plans.read()
    assert plan is not None and not plan.results
    assert plan.window_from == datetime.fromtimestamp(started + 1, UTC)
    engine.slices += [
        ("1", "live", started + 1, arm(800, 1)),
        (version, "canary", started + 1, arm(800, 2)),
    ]
    # Judged from the step's own slice, the calls before the split would stop it:
    whole = judge_canary(
        engine.window(version, ("canary",), started),
        engine.window("1", ("live",), started),
        Tally(),
        POLICY,
    )
    assert "score PSI" in _failed(whole)
    clock.now += timedelta(seconds=1)
    controller.tick()
    plan = plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.PROMOTED, plan.reason
    assert [r.step for r in plan.results] == ["canary 50%"]
