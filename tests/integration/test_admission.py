"""Admission at the edge: past its limit of calls in flight, Envoy refuses a call at once with
RESOURCE_EXHAUSTED and a pushback, and the calls it lets in are not queued behind the excess.

Judged against the same run's baseline (the mesh at ease), never a fixed number of
milliseconds; the rates themselves are the admission benchmark's (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import statistics
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, ghz
from services.common.edge_security import PUSHBACK_HEADER
from services.mesh import Mesh

from .conftest import Known, score_request, start_mesh

pytestmark = pytest.mark.integration

LIMIT = 2
"""Calls the edge lets in at once: far below what the overload step sends."""
PUSHBACK_MS = 40


@pytest.fixture(scope="module")
def limited(prepared_env: Any, known: Known, tmp_path_factory: pytest.TempPathFactory) -> Any:
    mesh = start_mesh(
        prepared_env,
        tmp_path_factory.mktemp("admission-logs"),
        known=known,
        FRAUD_EDGE_MAX_IN_FLIGHT=str(LIMIT),
        FRAUD_EDGE_PUSHBACK_MS=str(PUSHBACK_MS),
    )
    yield mesh
    mesh.stop()


def _overflows(mesh: Mesh) -> int:
    """Calls Envoy refused at the gateway cluster's circuit breaker (its own count)."""
    url = f"http://127.0.0.1:{mesh.config.admin_port}/stats?filter=upstream_rq_(pending|active)_overflow$"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        int(line.rsplit(":", 1)[1])
        for line in text.splitlines()
        if line.split(":")[0]
        in (
            "cluster.gateway.upstream_rq_pending_overflow",
            "cluster.gateway.upstream_rq_active_overflow",
        )
    )


def test_an_overload_is_refused_at_once_and_the_admitted_calls_are_not_queued(
    limited: Mesh, prepared_env: Any, tmp_path: Path
) -> None:
    try:
        binary = ghz.find_ghz()
    except ghz.GhzNotFoundError as error:
        pytest.fail(str(error))
    population = data.sample_population(prepared_env.var_dir / "data", 200)
    file = data.write_data_file(tmp_path / "score.json", data.score_requests(population, "now"))
    target = limited.config.envoy_target
    before = _overflows(limited)
    # At ease: one call at a time, well under the limit.
    base = ghz.run_ghz(
        ghz.SCORE, target, file, rps=20, duration_s=3, timeout_ms=2000, concurrency=1, ghz=binary
    )
    assert base.status_counts == {"OK": base.count}, base.errors
    assert _overflows(limited) == before
    # Overload: far more at once than the edge lets in. A queue would grow for the whole
    # step and every admitted call would wait behind it.
    over = ghz.run_ghz(
        ghz.SCORE, target, file, rps=600, duration_s=3, timeout_ms=2000, concurrency=50, ghz=binary
    )
    refused = over.status_counts.get("ResourceExhausted", 0)
    admitted = over.status_counts.get("OK", 0)
    late = over.status_counts.get("DeadlineExceeded", 0)
    # Nothing UNAVAILABLE, nothing failed otherwise: each call is answered or refused.
    assert set(over.status_counts) <= {"OK", "ResourceExhausted", "DeadlineExceeded"}, over.errors
    assert refused > 0 and admitted > 0, over.status_counts
    # Every refusal is the edge's own: the gateway never saw those calls.
    assert _overflows(limited) - before == refused
    # The admitted calls are not queued behind the excess: without a bound, a step past
    # saturation leaves most calls late (44-62 % at 600 calls/s in docs/reliability.md,
    # "Measured"); with it, a saturated 2-core machine still answers some late (2.3 % of
    # them in one run), never most.
    assert late <= 0.1 * (admitted + late), over.status_counts
    # A refusal costs less than an answer under the same load. Medians: one pause of a
    # shared machine moves a tail, not the middle.
    assert _median(over, "ResourceExhausted") < _median(over, "OK"), over.status_p99_ms


def _median(result: ghz.Result, status: str) -> float:
    return statistics.median(c.latency_ms for c in result.calls if c.status == status)


def test_a_refusal_says_when_to_come_back(limited: Mesh, known: Known) -> None:
    async def burst() -> list[grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(limited.config.envoy_target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            request = score_request(known)
            calls = [stub.Score(request, timeout=5.0) for _ in range(10 * LIMIT)]
            results = await asyncio.gather(*calls, return_exceptions=True)
        return [r for r in results if isinstance(r, grpc.aio.AioRpcError)]

    errors = asyncio.run(burst())
    assert errors, "a burst of 10x the limit was not refused at all"
    for error in errors:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        trailers = dict(error.trailing_metadata() or ())
        assert trailers.get(PUSHBACK_HEADER) == str(PUSHBACK_MS), trailers
        assert f"limit of {LIMIT} calls in flight" in (error.details() or "")
