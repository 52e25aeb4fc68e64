"""The crash matrix, short: under 60 calls/s through ``fraudmesh up``'s default mesh from four
cores (two Envoys, two gateways, two feature services, two scorers), SIGKILL of an Envoy, a
gateway, a feature service, a scorer, the updater and the decision sink in turn. A killed
gateway costs no call and no answered decision, an Envoy at most the calls in flight on it,
the others no call, and every answered decision is in the decision log afterwards; late calls
are judged against the run's unfaulted calls (``loadtest.crash``). Then the gateway's SIGKILL
again in the default mesh of a small machine (``services/mesh/sizing.py``: one Envoy, feature
service and scorer, two gateways in process, the edge's admission limit)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from loadtest.crash import Crash, CrashPlan, Row, markdown
from services.mesh import sizing

pytestmark = pytest.mark.integration

KILLED = ("envoy", "gateway", "features", "scorer", "updater", "decisionlog")
# 16 client connections: the kernel spreads them over the two Envoys' shared port, so the
# killed one holds some of them but with a chance of 2 in 65,536. 60 calls/s, as the short
# fault matrix: at 100 a slow 2-core machine runs at half its capacity before anything
# restarts, and a restart's own CPU then makes calls late that a faster one would not.
PLAN = CrashPlan(rps=60, before_s=3.0, after_s=4.0, tail_s=2.0, log_wait_s=60.0, connections=16)
SMALL = sizing.for_cores(2)
SMALL_PLAN = dataclasses.replace(
    PLAN,
    envoy_replicas=SMALL.envoy,
    gateway_replicas=SMALL.gateway,
    features_replicas=SMALL.features,
    scorer_replicas=SMALL.scorer,
    gateway_in_process=SMALL.gateway_in_process,
    edge_max_in_flight=SMALL.edge_max_in_flight,
    connections=4,
)


@pytest.fixture(scope="module")
def rows(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> list[Row]:
    crash = Crash(prepared_env.var_dir, tmp_path_factory.mktemp("crash"), PLAN)
    rows = crash.run(KILLED)
    print("\n" + markdown(rows, PLAN))
    return rows


def _row(rows: list[Row], name: str) -> Row:
    return next(r for r in rows if r.process == name)


def test_every_row_meets_its_expectation(rows: list[Row]) -> None:
    assert [r.process for r in rows] == [None, *KILLED]
    assert all(r.passed() for r in rows), markdown(rows, PLAN)


def test_a_killed_gateway_costs_no_call_and_no_decision(rows: list[Row]) -> None:
    row = _row(rows, "gateway")
    assert row.failed() == [], markdown([row], PLAN)
    assert row.missing == []
    assert row.ready_again_s is not None


def test_a_killed_envoy_fails_only_calls_in_flight_on_it(rows: list[Row]) -> None:
    row = _row(rows, "envoy")
    # The killed Envoy held some of the client's connections: its calls had to go elsewhere.
    assert row.connections_at_kill, row.connections_at_kill
    failed = row.failed()
    assert all(c.sent_s < row.kill_s <= c.ended_s for c in failed), markdown([row], PLAN)
    calls_after = [c for c in row.calls if c.sent_s >= row.kill_s]
    assert calls_after and all(not c.failed for c in calls_after)


def test_every_answered_decision_reaches_the_log(rows: list[Row]) -> None:
    assert sum(len(r.answered()) for r in rows) > 1000
    assert {r.name: r.missing[:3] for r in rows if r.missing} == {}


def test_a_replica_of_a_backend_takes_over(rows: list[Row]) -> None:
    for name in ("features", "scorer"):
        row = _row(rows, name)
        assert row.failed() == []
        assert row.quality_back_s() is not None, markdown([row], PLAN)
        # The other replica answers meanwhile: degraded answers are the calls in flight on
        # the killed one and a few more around it, not every call until it is back.
        degraded = [c for c in row.calls if c.degraded and c.ended_s >= row.kill_s]
        assert len(degraded) < 0.1 * len([c for c in row.calls if c.ended_s >= row.kill_s])


def test_a_killed_gateway_costs_no_call_in_a_small_machines_mesh(
    prepared_env: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    crash = Crash(prepared_env.var_dir, tmp_path_factory.mktemp("crash-small"), SMALL_PLAN)
    rows = crash.run(("gateway",))
    report = markdown(rows, SMALL_PLAN)
    print("\n" + report)
    assert all(r.passed() for r in rows), report
    row = _row(rows, "gateway")
    assert row.failed() == [] and row.missing == [], report
    assert row.ready_again_s is not None
