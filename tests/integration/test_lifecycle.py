"""Model lifecycle under load through Envoy, with two gateway replicas and real processes.

A second version is published while traffic flows (it must not answer), scores in shadow
(compared, never answering), is given 20% of the cards, promoted and rolled back; a gateway restarts in the middle and comes back on
the same routing. Then two bad candidates (one declining everything, one too slow for
its slice of the budget) are canaried and must be rolled back automatically, each by
exactly one writer, without the rules fallback ever answering for them. Every call must
be answered, on time.

"On time" and "never the rules" are judged against the same run's baseline, the calls before
the first change: each phase between two changes may hold at most the baseline's share of
calls that failed, were late (DEADLINE_EXCEEDED at the client's 42 ms deadline, or answered
past it) or were answered by the rules, plus max(15 calls, 1 %) (``loadtest.faultwindow``).
A machine that starves now and then misses a slice in every phase alike; a transition that
costs calls does not.

Each change is made through the lifecycle file, as the ``fraudmesh model`` commands do;
the routing must hold everywhere one second after the change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fraud.v1 import events_pb2
from fraud.v1 import scoring_pb2 as pb
from loadtest import data, faultwindow
from loadtest.drive import Call, Calls, Driver
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.common.settings import to_env
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.eventlog import EventLogSettings, open_consumer
from services.gateway.routing import card_bucket
from services.mesh import Mesh, MeshConfig, free_port
from services.models import repository
from services.models.lifecycle import CANARY_BUCKETS, ModelLifecycle, VersionState

from .conftest import Known, first_full_quality, register_logs

pytestmark = pytest.mark.integration

RPS = 60
"""Steady traffic through Envoy: at 100 calls/s a 2-core machine running two gateways, the
scorer and a restarting process queues enough that the slow canary's 8 ms slice, added to a
fifth of the calls, pushes calls past 42 ms that the baseline never had (as the crash
matrix's short version, which runs at 60 calls/s for the same reason)."""
BASELINE_S = 3.0
"""Traffic before the first change: the baseline every phase is judged against."""
SETTLE_S = 1.0
"""A routing change must hold on every replica this long after it was written."""
SLOW_VERSION = "2"
"""Published before the mesh starts; the scorer delays this version past its canary slice."""
DECLINING_VERSION = "3"
"""Published before the mesh starts; declines every transaction."""


def publish_variant(lifecycle: ModelLifecycle, base: str, **changes: Any) -> str:
    """Publishes ``base``'s ONNX model with changed metadata as a new candidate, without a
    small model: each variant's behaviour is its full model's alone (no cascade)."""
    metadata, folder = repository.load(lifecycle.model_root, lifecycle.name, base)
    published, _, _ = lifecycle.publish_candidate(
        metadata.model_copy(update={"small_model": None, **changes}),
        {repository.MODEL_FILE: folder / repository.MODEL_FILE},
    )
    return published.version


@dataclass(frozen=True)
class Stage:
    """A mesh whose models live in a private folder, and the traffic to send it."""

    mesh: Mesh
    lifecycle: ModelLifecycle
    population: list[data.Txn]


@pytest.fixture(scope="module")
def stage(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("lifecycle-models")
    shutil.copytree(prepared_env.model_root, root, dirs_exist_ok=True)
    lifecycle = ModelLifecycle(root)
    live = lifecycle.read().routing.live
    assert live == prepared_env.model_version
    t = repository.load(root, lifecycle.name, live)[0].thresholds
    assert publish_variant(lifecycle, live) == SLOW_VERSION
    declining = repository.Thresholds(review=0.0, decline=0.0)
    assert publish_variant(lifecycle, live, thresholds=declining) == DECLINING_VERSION
    assert lifecycle.read().routing.live == live and t.review > 0
    config = MeshConfig.on_free_ports(
        gateway_replicas=2,
        metrics_ports={"gateway": free_port(), "gateway-2": free_port()},
        var_dir=prepared_env.var_dir,
        log_dir=register_logs(request, tmp_path_factory.mktemp("lifecycle-logs")),
        extra_env={
            "FRAUD_GATEWAY_MODEL_ROOT": str(root),
            "FRAUD_SCORER_MODEL_ROOT": str(root),
            "FRAUD_SCORER_FAULT_DELAY_MS": "40",
            "FRAUD_SCORER_FAULT_DELAY_VERSIONS": SLOW_VERSION,
            "FRAUD_GATEWAY_CANARY_MIN_CALLS": "30",
            # The decision events of this mesh alone, on a topic of its own.
            **to_env(EventLogSettings, topic=EVENT_TOPIC),
        },
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=120)
    try:
        first_full_quality(config.envoy_target, known)
        population = data.sample_population(prepared_env.data_dir, 2000, seed=11)
        yield Stage(mesh, lifecycle, population)
    finally:
        mesh.stop()


def _canary_share(population: list[data.Txn], percent: float) -> float:
    """The share of calls whose card goes to a canary at ``percent``."""
    cut = round(percent * CANARY_BUCKETS / 100)
    return sum(card_bucket(t.card_id) < cut for t in population) / len(population)


EVENT_TOPIC = f"lifecycle-{uuid.uuid4().hex[:8]}"
"""The event log topic of this module's mesh."""

CANARY_CUT_OFF_SHARE = 0.05
"""Share of a canary's model answers that live may give instead: a canary call cut off by
its own slice of the budget (8 ms) is answered by live, by design, and a starved machine
cuts one off now and then. The rules never answer for it (judged against the baseline)."""


def _bad(call: Call) -> bool:
    """Failed, late (at or past the client's 42 ms deadline), or answered by the rules."""
    late = faultwindow.late_or_failed(call.status == "OK", call.latency_s * 1000)
    return late or call.scored_by != pb.SCORED_BY_MODEL


def _ended(calls: Calls, start_s: float, end_s: float) -> list[Call]:
    """Calls that ended in [start_s, end_s): a call in flight at a change belongs to it."""
    return [c for c in calls.calls if start_s <= c.sent_s + c.latency_s < end_s]


def _where(calls: Calls, t0: float) -> list[tuple[float, str, float, str]]:
    """(s from ``t0``, status, ms, answering version) of every bad call."""
    return [
        (round(c.sent_s - t0, 2), c.status, round(c.latency_s * 1000, 1), c.model_version)
        for c in calls.calls
        if _bad(c)
    ]


def _phases_cost_no_more_than_the_baseline(calls: Calls, marks: dict[str, float]) -> None:
    """No status but OK and DEADLINE_EXCEEDED; each phase between two marks (in time order)
    judged against the calls that ended before the first mark."""
    statuses = calls.statuses()
    t0 = min(marks.values())
    relative = {k: round(v - t0, 2) for k, v in marks.items()}
    assert set(statuses) <= {"OK", "DEADLINE_EXCEEDED"}, (dict(statuses), relative)
    baseline = faultwindow.tally(_ended(calls, 0.0, t0), _bad)
    assert baseline.calls > 0, "no baseline traffic"
    bounds = sorted(marks.items(), key=lambda item: item[1])
    ends = [moment for _, moment in bounds[1:]] + [float("inf")]
    failed = []
    for (name, start), end in zip(bounds, ends, strict=True):
        verdict = faultwindow.judge(baseline, faultwindow.tally(_ended(calls, start, end), _bad))
        print(f"{name}: {verdict}")
        if verdict.fault.calls and not verdict.ok:
            failed.append(f"{name}: {verdict}")
    assert not failed, f"{failed}; marks {relative}; {_where(calls, t0)}"


def _shadow_comparisons(mesh: Mesh, version: str) -> float:
    """Shadow comparisons of ``version`` recorded by every gateway."""
    return sum(
        scrape.fetch(scrape.url(mesh.config.host, port)).sum(
            catalogue.SHADOW_DECISIONS, model_version=version
        )
        for port in mesh.config.metrics_ports.values()
    )


def _decision_events(mesh: Mesh) -> list[events_pb2.DecisionEvent]:
    """Every decision event on the mesh's topic so far, read by a group of the test's own."""
    settings = EventLogSettings(var_dir=mesh.config.var_dir, topic=EVENT_TOPIC, groups=())
    found: list[events_pb2.DecisionEvent] = []
    with open_consumer(settings, f"audit-{uuid.uuid4().hex[:8]}") as consumer:
        while records := consumer.poll(5000, 0.5):
            for record in records:
                envelope = record.envelope()
                if envelope.WhichOneof("event") == "decision":
                    found.append(envelope.decision)
    return found


def _rules_version() -> str:
    return RulesEngine.load(DEFAULT_RULES, featurespec.MODEL_FEATURES).version


def _wait(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_publish_canary_promote_rollback_under_load(stage: Stage) -> None:
    lifecycle, population = stage.lifecycle, stage.population
    live = lifecycle.read().routing.live
    assert live is not None
    cut = round(20 * CANARY_BUCKETS / 100)
    canary_cards = {t.card_id for t in population if card_bucket(t.card_id) < cut}
    driver = Driver(stage.mesh.config.envoy_target, population, RPS)
    driver.start()
    marks: dict[str, float] = {}
    try:
        time.sleep(BASELINE_S)
        marks["published"] = time.monotonic()
        live_metadata = repository.load(lifecycle.model_root, lifecycle.name, live)[0]
        t = live_metadata.thresholds
        # The new version's thresholds differ, so answers show whose metadata was used.
        new = publish_variant(
            lifecycle,
            live,
            thresholds=repository.Thresholds(review=t.review * 0.9, decline=t.decline),
        )
        assert lifecycle.read().versions[new].state is VersionState.CANDIDATE
        time.sleep(3)
        marks["shadow"] = time.monotonic()
        lifecycle.shadow(new)
        time.sleep(3)
        marks["canary"] = time.monotonic()
        lifecycle.canary(new, 20)
        time.sleep(6)
        marks["restart"] = time.monotonic()
        stage.mesh.restart("gateway-2")
        marks["restarted"] = time.monotonic()
        time.sleep(4)
        marks["promote"] = time.monotonic()
        lifecycle.promote(new)
        time.sleep(4)
        marks["rollback"] = time.monotonic()
        lifecycle.rollback(reason="test")
        time.sleep(4)
        marks["end"] = time.monotonic()
    finally:
        calls = driver.stop()

    assert len(calls) >= 0.8 * RPS * (marks["end"] - marks["published"])
    _phases_cost_no_more_than_the_baseline(calls, marks)

    before_canary = calls.between(0, marks["canary"])
    assert set(before_canary.model_versions()) == {live}, "a candidate or shadow answered"
    compared = _shadow_comparisons(stage.mesh, new)
    assert compared >= 0.5 * RPS * (marks["canary"] - marks["shadow"] - SETTLE_S), compared

    canary = calls.between(marks["canary"] + SETTLE_S, marks["promote"])
    by_model = [c for c in canary.ok() if c.scored_by == pb.SCORED_BY_MODEL]
    for call in by_model:
        if call.card_id not in canary_cards:
            assert call.model_version == live, (call, "a card outside the canary got it")
    fell_back = [c for c in by_model if c.card_id in canary_cards and c.model_version != new]
    assert len(fell_back) <= CANARY_CUT_OFF_SHARE * len(canary), fell_back[:3]
    assert {c.model_version for c in fell_back} <= {live}
    share = canary.model_versions()[new] / canary.model_versions().total()
    assert abs(share - _canary_share(population, 20)) < 0.03, share
    assert abs(share - 0.20) < 0.05, share
    review_new = f"{t.review * 0.9:.3f}"
    for call in by_model:
        if call.model_version == new and "review threshold" in call.reasons[0]:
            assert call.reasons[0].endswith(review_new), call.reasons[0]

    promoted = calls.between(marks["promote"] + SETTLE_S, marks["rollback"])
    assert set(promoted.model_versions()) == {new}
    rolled_back = calls.between(marks["rollback"] + SETTLE_S, marks["end"])
    assert set(rolled_back.model_versions()) == {live}

    # Decision events name the arm that answered and carry the shadow's score.
    def events_landed() -> bool:
        found = _decision_events(stage.mesh)
        shadowed = [e for e in found if e.shadow_model_version == new]
        canaried = [
            e for e in found if e.route == events_pb2.ROUTE_CANARY and e.model_version == new
        ]
        landed.update(shadowed=shadowed, canaried=canaried, found=found)
        return len(shadowed) >= 0.5 * compared and len(canaried) >= 0.5 * answered_by_canary

    answered_by_canary = canary.model_versions()[new]
    landed: dict[str, list[events_pb2.DecisionEvent]] = {}
    assert _wait(events_landed, 60), {k: len(v) for k, v in landed.items()}
    for event in landed["shadowed"]:
        assert event.HasField("shadow_score") and 0.0 <= event.shadow_score <= 1.0
        assert event.model_version == live and event.route == events_pb2.ROUTE_LIVE
    assert all(e.HasField("shadow_score") is False for e in landed["canaried"])

    state = lifecycle.read()
    assert state.routing.live == live and state.routing.previous is None
    assert state.versions[new].state is VersionState.RETIRED
    moves = [(h.from_state, h.to_state) for h in state.history if h.version == new]
    assert moves == [
        (None, VersionState.CANDIDATE),
        (VersionState.CANDIDATE, VersionState.SHADOW),
        (VersionState.SHADOW, VersionState.CANARY),
        (VersionState.CANARY, VersionState.LIVE),
        (VersionState.LIVE, VersionState.RETIRED),
    ]


@pytest.mark.parametrize(
    ("version", "symptom"),
    [(DECLINING_VERSION, "decline rate"), (SLOW_VERSION, "error rate")],
    ids=["declining", "slow"],
)
def test_bad_canary_is_rolled_back_automatically(stage: Stage, version: str, symptom: str) -> None:
    lifecycle = stage.lifecycle
    live = lifecycle.read().routing.live
    driver = Driver(stage.mesh.config.envoy_target, stage.population, RPS)
    driver.start()
    try:
        time.sleep(BASELINE_S)
        started = time.monotonic()
        lifecycle.canary(version, 20)
        assert _wait(lambda: lifecycle.read().versions[version].state is VersionState.RETIRED, 30)
        rolled_back = time.monotonic()
        time.sleep(2)
        ended = time.monotonic()
    finally:
        calls = driver.stop()

    _phases_cost_no_more_than_the_baseline(
        calls, {"canary": started, "rolled back": rolled_back, "end": ended}
    )
    cut = round(20 * CANARY_BUCKETS / 100)
    during = [c for c in calls.between(started, rolled_back).ok() if card_bucket(c.card_id) < cut]
    assert {c.model_version for c in during} <= {version, live, f"rules-{_rules_version()}"}
    # The canary's own cards meet the rules (or fail, or wait) no more than the baseline did.
    mine = Calls([c for c in _ended(calls, started, rolled_back) if card_bucket(c.card_id) < cut])
    baseline = faultwindow.tally(_ended(calls, 0.0, started), _bad)
    verdict = faultwindow.judge(baseline, faultwindow.tally(mine.calls, _bad))
    print(f"the canary's cards: {verdict}")
    assert verdict.ok, f"the canary's cards: {verdict}; {_where(mine, started)}"
    state = lifecycle.read()
    assert state.routing.canary is None and state.routing.live == live
    record = state.versions[version]
    assert record.reason.startswith("automatic rollback:") and symptom in record.reason
    writes = [
        h for h in state.history if h.version == version and h.to_state is VersionState.RETIRED
    ]
    assert len(writes) == 1, writes
    assert writes[0].by.startswith("gateway:")
    assert rolled_back - started < 20
    after = calls.between(ended - 1.0, ended)
    assert set(after.model_versions()) == {live}

    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "model",
            "list",
            "--model-root",
            str(lifecycle.model_root),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert f"v{version} retired" in shown and "automatic rollback" in shown
