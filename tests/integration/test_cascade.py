"""The cascade through Envoy, with real processes and the live loop on.

A stopped scorer (SIGSTOP) under steady traffic: every call is still answered on time (no
more late or failed calls than the same run's baseline allows), by the version's small model
and never by the rules; after SIGCONT the model answers again. And a day replayed in order
through the gateway, on a store holding the history before it: the share of answers the
first stage gave without the scorer, per answer and in the gateway's metrics, matches the
training report's estimate.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, faultwindow
from loadtest.drive import Call, Calls, Driver
from services.common import metric_catalogue as catalogue
from services.mesh import Mesh
from services.models import repository
from services.models.lifecycle import ModelLifecycle

from .conftest import CASCADE_ENV
from .live import DayState, copy_state, day_request, day_state, metric, metrics_url, start_live_mesh

pytestmark = pytest.mark.integration

CASCADE_ON = {CASCADE_ENV: "true"}
SMALL = (pb.SCORED_BY_FIRST_STAGE, pb.SCORED_BY_SMALL_MODEL)
SHARE_TOLERANCE = 0.03
"""How far the replayed day's first-stage share may be from the training estimate (points):
a day of the small preset holds about 700 payments, a share's standard error about 1 point,
and the estimate is over the whole test period."""


def _late_or_failed(call: Call) -> bool:
    return faultwindow.late_or_failed(call.status == "OK", call.latency_s * 1000)


def _verdict(baseline: Calls, window: Calls) -> faultwindow.Verdict:
    """The window's late or failed calls against the baseline's share of them, with the
    shared slack (a loaded machine starves a few calls whatever happens)."""
    return faultwindow.judge(
        faultwindow.tally(baseline.calls, _late_or_failed),
        faultwindow.tally(window.calls, _late_or_failed),
    )


def _fallback_reasons(calls: Calls) -> Counter[str]:
    """Why the small model stood in, by reason."""
    return Counter(r for c in calls.ok() for r in c.reasons if r.startswith("small model fallback"))


def _engines(calls: Calls) -> Counter[int]:
    return Counter(c.scored_by for c in calls.ok())


@pytest.fixture(scope="module")
def cascade_mesh(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh with the cascade on, on its own copy of the prepared state."""
    home = tmp_path_factory.mktemp("cascade")
    var_dir = copy_state(prepared_env.var_dir, home / "var")
    mesh = start_live_mesh(var_dir, home / "logs", extra_env=CASCADE_ON)
    yield mesh
    mesh.stop()


RECOVERY_S = 20.0
"""Longest the model may take to answer again after SIGCONT: the scorer drains what queued
while it was stopped, and a breaker that reopens on the first slow probes waits its 2 s."""
RECOVERED_SPAN_S = 2.0
"""The span of calls that shows the model back: model answers, the small model standing in
no more often than in the baseline."""


def _recovered(window: Calls, baseline: Calls) -> bool:
    engines = _engines(window)
    standing_in = faultwindow.tally(
        baseline.ok(), lambda c: c.scored_by == pb.SCORED_BY_SMALL_MODEL
    )
    return (
        len(window) > 0
        and engines[pb.SCORED_BY_MODEL] > 0
        and engines[pb.SCORED_BY_RULES] == 0
        and engines[pb.SCORED_BY_SMALL_MODEL] <= faultwindow.allowed(standing_in, len(window))
    )


def test_a_stopped_scorer_is_answered_on_time_by_the_small_model_then_by_the_model(
    cascade_mesh: Mesh,
) -> None:
    population = data.sample_population(cascade_mesh.config.var_dir / "data", 400)
    scorer = cascade_mesh.processes["scorer"]
    # The budget as the deadline, as payment clients send it: the gateway plans its slices
    # on the time the call has left when it arrives, and a late answer is DEADLINE_EXCEEDED.
    driver = Driver(cascade_mesh.config.envoy_target, population, rps=40)
    driver.start()
    began = time.monotonic()
    stopped_at = resumed_at = back_at = None
    try:
        time.sleep(5.0)
        scorer.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        time.sleep(6.0)
        scorer.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        baseline = Calls(list(driver.calls.calls)).between(began + 1.0, stopped_at)
        while back_at is None and time.monotonic() < resumed_at + RECOVERY_S:
            time.sleep(0.25)
            # Calls sent long enough ago to have ended (their deadline is 42 ms).
            end = time.monotonic() - 0.5
            start = max(resumed_at, end - RECOVERED_SPAN_S)
            span = Calls(list(driver.calls.calls)).between(start, end)
            if end - start >= RECOVERED_SPAN_S - 1e-6 and _recovered(span, baseline):
                back_at = start
    finally:
        if stopped_at is not None and resumed_at is None:
            scorer.signal(signal.SIGCONT)
        calls = driver.stop()

    assert stopped_at is not None and resumed_at is not None
    # The first second opens the client's connection: neither baseline nor fault.
    baseline = calls.between(began + 1.0, stopped_at)
    stopped = calls.between(stopped_at, resumed_at)
    base_engines, stop_engines = _engines(baseline), _engines(stopped)
    assert base_engines[pb.SCORED_BY_MODEL] >= 10, base_engines
    assert base_engines[pb.SCORED_BY_FIRST_STAGE] >= 10, base_engines

    verdict = _verdict(baseline, stopped)
    print(f"scorer stopped: {verdict}")
    assert verdict.ok, (str(verdict), stopped.statuses())
    # Every answer while the scorer is stopped comes from the small model: its clear approvals
    # and, for the rest, its answers with its own thresholds. Never the rules, nor the model.
    assert set(stop_engines) <= set(SMALL), stop_engines
    assert stop_engines[pb.SCORED_BY_SMALL_MODEL] >= 5, stop_engines
    versions = {c.model_version for c in stopped.ok()}
    assert versions == {ModelLifecycle(cascade_mesh.config.var_dir / "models").read().routing.live}

    assert back_at is not None, (
        f"the model did not answer again within {RECOVERY_S:.0f} s of SIGCONT: "
        f"{_engines(calls.between(resumed_at, resumed_at + RECOVERY_S))}, "
        f"{_fallback_reasons(calls.between(resumed_at, resumed_at + RECOVERY_S))}"
    )
    recovering = calls.between(resumed_at, back_at + RECOVERED_SPAN_S)
    assert _engines(recovering)[pb.SCORED_BY_RULES] == 0, _engines(recovering)
    verdict = _verdict(baseline, recovering)
    assert verdict.ok, (str(verdict), recovering.statuses())
    print(
        f"baseline {base_engines}, stopped {stop_engines}; the model back "
        f"{back_at - resumed_at:.1f} s after SIGCONT"
    )


@dataclass(frozen=True)
class ReplayDay:
    """A state folder holding the history before a day, and that day's payments in order."""

    state: DayState
    estimate: float
    """The training report's first-stage share on the test period."""


@pytest.fixture(scope="module")
def replay_day(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> ReplayDay:
    state = day_state(prepared_env, tmp_path_factory.mktemp("replay-day"))
    live = ModelLifecycle(state.var_dir / "models").read().routing.live
    metadata, _ = repository.load(state.var_dir / "models", version=live)
    window = metadata.training_window
    assert window.holdout_start <= state.start, "the day must be in the test period"
    return ReplayDay(state, metadata.metrics["cascade_first_stage_share"])


def test_the_first_stage_share_of_a_replayed_day_matches_the_training_estimate(
    replay_day: ReplayDay, tmp_path: Path
) -> None:
    mesh = start_live_mesh(replay_day.state.var_dir, tmp_path / "logs", extra_env=CASCADE_ON)
    try:
        gateway = metrics_url(mesh, "gateway")
        before = {
            engine: metric(gateway, catalogue.DECISIONS, scored_by=engine)
            for engine in ("first_stage", "model", "small_model", "rules")
        }
        engines: Counter[int] = Counter()
        with grpc.insecure_channel(mesh.config.envoy_target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            for row in replay_day.state.day.itertuples():
                # In order and paced, so the live loop has applied a card's previous payment
                # before its next one is scored, as in production.
                answer = stub.Score(day_request(row), timeout=2.0)
                engines[answer.scored_by] += 1
                time.sleep(0.005)
        answered = sum(engines.values())
        share = engines[pb.SCORED_BY_FIRST_STAGE] / answered
        counted = {
            engine: metric(gateway, catalogue.DECISIONS, scored_by=engine) - before[engine]
            for engine in before
        }
    finally:
        mesh.stop()
    print(
        f"replayed {answered} payments: first stage {share:.1%}, "
        f"training estimate {replay_day.estimate:.1%}; {engines}"
    )
    assert answered == len(replay_day.state.day)
    assert engines[pb.SCORED_BY_RULES] == 0 and engines[pb.SCORED_BY_MODEL] > 0
    # The metric counts what the answers said.
    assert counted["first_stage"] == engines[pb.SCORED_BY_FIRST_STAGE], counted
    assert counted["model"] == engines[pb.SCORED_BY_MODEL], counted
    assert abs(share - replay_day.estimate) <= SHARE_TOLERANCE, (share, replay_day.estimate)
