"""Hostile input through the real mesh: every generated kind of bad call gets its own status
(INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED for oversize, NOT_FOUND for a plain
unknown name), valid calls get OK, nothing gets INTERNAL, UNKNOWN or UNAVAILABLE, and the mesh
keeps answering normally afterwards.

The suites of ``loadtest.hostile`` run with a fixed derandomized seed, so every run sends the
same calls, in rounds of one call of every kind sent at once: Score and health (5,000 calls)
and ReportOutcome (1,000) through Envoy; GetFeatures (1,000), StreamFeatures (300 streams)
and the scorer's repository RPCs (1,000) to the services directly, as Envoy routes neither.
A kind answered DEADLINE_EXCEEDED more than its cap (``hostile.late_allowance``: 1, plus the
share of valid Score calls answered late in the same run times the kind's calls), or a late
call that re-sent alone still fails, fails the test: validation that hangs cannot pass.

The module runs on its own copy of the prepared state: its traffic changes online features and
the event log, and its model folder holds bait: a sibling model's complete version, a complete
version outside the model root, and a symlink, each reachable by a path-like version if one
ever became a path. Further tests fire random bytes at every method every service lists
through reflection (unary and streaming), and odd metadata at the edge and the gateway.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fraud.v1 import features_pb2, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from loadtest import hostile
from services import client
from services.mesh import Mesh, MeshConfig
from services.models import repository
from services.models.lifecycle import ModelLifecycle

from .conftest import Known
from .live import copy_state

pytestmark = pytest.mark.integration

SCORE_CALLS = 5_000
OUTCOME_CALLS = 1_000
FEATURE_CALLS = 1_000
STREAMS = 400
REPOSITORY_CALLS = 1_000

AT_LEAST_PER_KIND = 20
"""Fewest calls any kind must have been judged on (each suite sends more per kind)."""

NAME = repository.DEFAULT_MODEL_NAME


@dataclass(frozen=True)
class HostileState:
    """This module's copy of the prepared state, and what its model folder publishes."""

    var_dir: Path
    repository: hostile.Repository


@pytest.fixture(scope="module")
def hostile_state(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> HostileState:
    """The prepared state copied, a candidate version published beside the live one, and bait
    for path-like versions."""
    var_dir = copy_state(prepared_env.var_dir, tmp_path_factory.mktemp("hostile-state"))
    models = var_dir / "models"
    live = prepared_env.model_version
    metadata, folder = repository.load(models, NAME, live)
    files = {repository.MODEL_FILE: folder / repository.MODEL_FILE}
    # The full model alone: what is under test is the repository's lookup, not the cascade.
    metadata = metadata.model_copy(update={"small_model": None})
    candidate, _, _ = ModelLifecycle(models).publish_candidate(metadata, files)
    sibling = repository.publish(models, metadata.model_copy(update={"name": "other"}), files)
    outside = var_dir / "outside-models"
    shutil.copytree(folder, outside / "1")
    (models / NAME / "latest").symlink_to(live)
    bait = (
        f"../{sibling.parent.name}/{sibling.name}",
        "../../outside-models/1",
        str(outside / "1"),
        "latest",
        f"{live}/../{candidate.version}",
    )
    for version in bait:
        # Each one leads to a complete version: a lookup of the path would find a model.
        assert (models / NAME / version / repository.METADATA_FILE).is_file(), version
    return HostileState(var_dir, hostile.Repository(NAME, live, candidate.version, bait))


@pytest.fixture(scope="module")
def hostile_mesh(
    hostile_state: HostileState, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    """A mesh on the module's state whose edge rate limit stays out of the way of the rounds."""
    config = MeshConfig.on_free_ports(
        var_dir=hostile_state.var_dir,
        log_dir=tmp_path_factory.mktemp("hostile-logs"),
        rate_limit_rps=100_000,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=120)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def population(known: Known) -> hostile.Population:
    """Known entities plus a few the store has never seen."""
    return hostile.Population(
        card_ids=[known.card_id, "card-unknown-0001", "card-000001"],
        merchant_ids=[known.merchant_id, "merch-00001"],
    )


def _target(mesh: Mesh, service: str) -> str:
    config = mesh.config
    port = {
        "envoy": config.envoy_port,
        "gateway": config.gateway_port,
        "features": config.features_port,
        "scorer": config.scorer_port,
    }[service]
    return f"{config.host}:{port}"


def _valid_call_succeeds(target: str, known: Known) -> pb.ScoreResponse:
    """A valid call answered by the model on online features. Right after a flood on a
    starved machine the breakers may still be open (slow calls trip them): they close after
    their cool-down, so the mesh is polled for a while rather than judged on one call."""
    deadline = time.monotonic() + 30.0
    while True:
        sample = client.Sample("after", known.card_id, known.merchant_id, known.amount_minor)
        response = client.score(target, sample.request(), timeout_s=1.0)
        full = (
            response.scored_by == pb.SCORED_BY_MODEL
            and response.feature_source == pb.FEATURE_SOURCE_ONLINE
        )
        if full or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def _run_and_judge(
    target: str, suite: hostile.Suite, calls: int
) -> tuple[list[hostile.Outcome], float]:
    """Runs a suite, prints its table, and fails on any broken rule or an unjudged kind;
    returns the outcomes and the run's baseline (share of valid Score calls late)."""
    outcomes = hostile.run(target, suite, calls, strict=True)
    print(f"\n{suite.name}\n" + hostile.summary(outcomes))
    baseline = hostile.baseline_late_share(outcomes)
    problems = hostile.judge(outcomes, baseline)
    assert not problems, problems[:20]
    assert not hostile.missing_kinds(outcomes, suite.judged_kinds(), AT_LEAST_PER_KIND)
    return outcomes, baseline


def test_score_and_health_through_envoy_get_their_status_kind_by_kind(
    hostile_mesh: Mesh, population: hostile.Population, known: Known
) -> None:
    suite = hostile.score_suite(population)
    outcomes, baseline = _run_and_judge(_target(hostile_mesh, "envoy"), suite, SCORE_CALLS)
    assert len(outcomes) >= SCORE_CALLS
    valid = Counter(o.code for o in outcomes if o.case.kind == hostile.VALID_SCORE_KIND)
    print(f"valid Score: {dict(valid)}; late baseline {baseline:.2%}")
    # Valid calls may be shed or late on a saturated machine (their late share is the
    # baseline of the invalid kinds' cap), but a mesh that answers few of them fails.
    assert valid["OK"] >= 0.5 * sum(valid.values()), valid
    response = _valid_call_succeeds(_target(hostile_mesh, "envoy"), known)
    assert response.scored_by == pb.SCORED_BY_MODEL


def test_report_outcome_through_envoy_gets_its_status_kind_by_kind(
    hostile_mesh: Mesh, known: Known
) -> None:
    outcomes, _ = _run_and_judge(
        _target(hostile_mesh, "envoy"), hostile.outcome_suite(), OUTCOME_CALLS
    )
    # Unknown enum numbers and out-of-range timestamps each had their own calls.
    kinds = Counter(o.case.kind for o in outcomes)
    for kind in (
        "ReportOutcome: outcome unknown number",
        "ReportOutcome: source unknown number",
        "ReportOutcome: reported_at out of range",
        "ReportOutcome: reported_at nanos out of range",
    ):
        assert kinds[kind] >= OUTCOME_CALLS // len(hostile.outcome_suite().kinds), kinds
    assert _valid_call_succeeds(_target(hostile_mesh, "envoy"), known).scored_by == (
        pb.SCORED_BY_MODEL
    )


def test_get_features_gets_its_status_kind_by_kind(
    hostile_mesh: Mesh, population: hostile.Population
) -> None:
    _run_and_judge(
        _target(hostile_mesh, "features"), hostile.features_suite(population), FEATURE_CALLS
    )


def test_stream_features_answers_each_request_and_ends_on_a_bad_message(
    hostile_mesh: Mesh, population: hostile.Population
) -> None:
    outcomes, _ = _run_and_judge(
        _target(hostile_mesh, "features"), hostile.stream_suite(population), STREAMS
    )
    assert sum(o.case.kind.endswith("ends the stream") for o in outcomes) >= 50


def test_repository_rpcs_refuse_path_like_names_and_versions_and_never_reach_the_bait(
    hostile_mesh: Mesh, hostile_state: HostileState, known: Known
) -> None:
    repo = hostile_state.repository
    target = _target(hostile_mesh, "scorer")
    _run_and_judge(target, hostile.repository_suite(repo), REPOSITORY_CALLS)
    with grpc.insecure_channel(target) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(v2.RepositoryIndexRequest(), timeout=10)
        # Only what the model's folder publishes is listed, loaded or not: no bait was loaded.
        assert sorted(m.version for m in index.models) == sorted([repo.live, str(repo.candidate)])
        for version in repo.bait:
            for request in (v2.RepositoryModelLoadRequest, v2.RepositoryModelUnloadRequest):
                call = request(model_name=NAME)
                call.parameters["version"].string_param = version
                method = (
                    stub.RepositoryModelLoad
                    if request is v2.RepositoryModelLoadRequest
                    else stub.RepositoryModelUnload
                )
                with pytest.raises(grpc.RpcError) as caught:
                    method(call, timeout=10)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, version
        assert stub.ModelReady(v2.ModelReadyRequest(name=NAME, version=repo.live)).ready
    assert _valid_call_succeeds(_target(hostile_mesh, "envoy"), known).scored_by == (
        pb.SCORED_BY_MODEL
    )


def test_metadata_up_to_the_edge_limits_is_served_and_beyond_them_refused(
    hostile_mesh: Mesh, known: Known
) -> None:
    # Envoy bounds a request's header block at 60 KiB and 100 headers (gRPC's own among
    # them); the services accept 64 KiB, more than the edge forwards. Beyond the edge's
    # limits its HTTP/2 codec resets the stream (too many headers) or the connection (too
    # large): no gRPC status exists yet, and the client library reports INTERNAL
    # ("RST_STREAM") or UNAVAILABLE (docs/security.md).
    sample = client.Sample("metadata", known.card_id, known.merchant_id, known.amount_minor)
    data = sample.request().SerializeToString()
    with grpc.insecure_channel(hostile_mesh.config.envoy_target) as channel:
        stub = channel.unary_unary("/fraud.v1.FraudScoring/Score")
        for size in (9_000, 20_000, 40_000, 60_000):
            stub(data, timeout=2, metadata=[("x-note", "n" * size)])
        stub(data, timeout=2, metadata=[(f"x-entry-{i}", "v") for i in range(90)])
        with pytest.raises(grpc.RpcError) as caught:
            stub(data, timeout=2, metadata=[(f"x-entry-{i}", "v") for i in range(120)])
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert "RST_STREAM" in (caught.value.details() or "")
    with grpc.insecure_channel(hostile_mesh.config.envoy_target) as channel:
        stub = channel.unary_unary("/fraud.v1.FraudScoring/Score")
        with pytest.raises(grpc.RpcError) as caught:
            stub(data, timeout=2, metadata=[("x-note", "n" * 70_000)])
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _valid_call_succeeds(hostile_mesh.config.envoy_target, known).scored_by == (
        pb.SCORED_BY_MODEL
    )


def _served_methods(target: str) -> list[tuple[str, bool, bool]]:
    """(path, client streaming, server streaming) of every method of every service
    ``target`` lists through reflection."""
    with grpc.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=10)))
    # The descriptors of every service a server may list are imported in this module.
    assert features_pb2 and health_pb2 and v2 and outcomes_pb2
    pool = descriptor_pool.Default()
    methods = []
    for service in reply.list_services_response.service:
        descriptor = pool.FindServiceByName(service.name)
        for method in descriptor.methods:
            methods.append(
                (f"/{service.name}/{method.name}", method.client_streaming, method.server_streaming)
            )
    return methods


@pytest.mark.parametrize("service", ["gateway", "features", "scorer"])
def test_random_bytes_to_every_unary_method_of_every_service(
    hostile_mesh: Mesh, service: str, known: Known
) -> None:
    target = _target(hostile_mesh, service)
    methods = [path for path, cs, ss in _served_methods(target) if not cs and not ss]
    assert len(methods) >= 2, methods
    seen: Counter[str] = Counter()
    with grpc.insecure_channel(target) as channel:
        stubs = [channel.unary_unary(path) for path in methods]

        @settings(
            max_examples=60,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(st.binary(max_size=300), min_size=len(stubs), max_size=len(stubs)))
        def fire(payloads: list[bytes]) -> None:
            futures = [
                (path, stub.future(data, timeout=5))
                for path, stub, data in zip(methods, stubs, payloads, strict=True)
            ]
            for path, future in futures:
                try:
                    future.result()
                    seen["OK"] += 1
                except grpc.RpcError as error:
                    code = error.code().name
                    seen[code] += 1
                    assert code not in hostile.FORBIDDEN, (path, code, error.details())
                    assert code != "DEADLINE_EXCEEDED", (path, error.details())
                    assert len(error.details() or "") <= hostile.MAX_DETAILS

        fire()
        # An empty message is every field at its default: answered or refused clearly.
        for path, stub in zip(methods, stubs, strict=True):
            try:
                stub(b"", timeout=5)
                seen["OK"] += 1
            except grpc.RpcError as error:
                code = error.code().name
                assert code not in hostile.FORBIDDEN | {"DEADLINE_EXCEEDED"}, (path, code)
        # Oversized for every method: refused by grpcio's limit before decoding.
        for path, stub in zip(methods, stubs, strict=True):
            with pytest.raises(grpc.RpcError) as caught:
                stub(b"\x0a" + b"\xff" * (5 * 1024 * 1024), timeout=10)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, path
    print(service, dict(seen))
    assert seen["INVALID_ARGUMENT"] > 0
    assert _valid_call_succeeds(hostile_mesh.config.envoy_target, known).scored_by == (
        pb.SCORED_BY_MODEL
    )


@pytest.mark.parametrize("service", ["gateway", "features", "scorer"])
def test_random_bytes_to_every_streaming_method_of_every_service(
    hostile_mesh: Mesh, service: str
) -> None:
    # Each message a streamed method cannot parse ends its stream with INVALID_ARGUMENT
    # naming where the bytes break; a message that parses is answered (or ends the stream
    # with a clear status); health's Watch gets garbage as its one request.
    target = _target(hostile_mesh, service)
    methods = [(path, cs) for path, cs, ss in _served_methods(target) if cs or ss]
    assert methods, "every server lists reflection and health, which stream"
    seen: Counter[str] = Counter()
    with grpc.insecure_channel(target) as channel:

        @settings(
            max_examples=40,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=4))
        def fire(messages: list[bytes]) -> None:
            for path, client_streaming in methods:
                if client_streaming:
                    call: Any = channel.stream_stream(path)(iter(messages), timeout=2)
                else:
                    call = channel.unary_stream(path)(messages[0], timeout=0.5)
                try:
                    for _ in call:
                        pass
                    seen["OK"] += 1
                except grpc.RpcError as error:
                    code = error.code().name
                    seen[code] += 1
                    if path.endswith("/Watch") and code == "DEADLINE_EXCEEDED":
                        continue  # a valid Watch streams until its deadline
                    assert code not in hostile.FORBIDDEN, (path, code, error.details())
                    assert code != "DEADLINE_EXCEEDED", (path, error.details())
                    assert len(error.details() or "") <= hostile.MAX_DETAILS

        fire()
    print(service, [m for m, _ in methods], dict(seen))
    assert seen["INVALID_ARGUMENT"] > 0


def _curl_grpc(target: str, path: str, headers: list[str], body: bytes) -> tuple[int, str]:
    """(curl's exit status, grpc-status or "none") of one raw HTTP/2 call with exactly
    these headers: the odd ones no gRPC client library would send."""
    command = [
        "curl",
        "--silent",
        "--http2-prior-knowledge",
        "--max-time",
        "10",
        "--output",
        "/dev/null",
        "--dump-header",
        "-",
        "--data-binary",
        "@-",
        "-X",
        "POST",
    ]
    for header in headers:
        command += ["-H", header]
    command.append(f"http://{target}{path}")
    done = subprocess.run(command, input=body, capture_output=True, timeout=20, check=False)
    lines = done.stdout.decode(errors="replace").splitlines()
    status = next(
        (
            line.split(":", 1)[1].strip()
            for line in lines
            if line.lower().startswith("grpc-status:")
        ),
        "none",
    )
    return done.returncode, status


def _frame(message: bytes, compressed: bool = False) -> bytes:
    return bytes([1 if compressed else 0]) + len(message).to_bytes(4, "big") + message


REFUSED = -1
"""Any failing curl exit status: the peer reset the stream or the connection, so no response
(and no gRPC status) came back (curl reports 16, 18, 56 or 92 depending on timing)."""


def test_odd_metadata_at_the_edge_gets_the_stated_status(hostile_mesh: Mesh, known: Known) -> None:
    # What docs/security.md states for metadata no gRPC library would send. Envoy rewrites
    # grpc-timeout (a malformed one is no deadline: the 50 ms default applies); the rest is
    # forwarded, and what the gateway's gRPC core refuses before any of our code runs
    # (an unparsable -bin value or grpc-encoding, no "te: trailers") is never answered by
    # it: Envoy ends those calls at 50 ms. None of it is INTERNAL, UNKNOWN or a crash.
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed: run `make system`")
    target = hostile_mesh.config.envoy_target
    sample = client.Sample("odd", known.card_id, known.merchant_id, known.amount_minor)
    message = sample.request().SerializeToString()
    body = _frame(message)
    grpc_headers = ["content-type: application/grpc", "te: trailers"]
    ok, late, internal = "0", "4", "13"
    cases: list[tuple[str, list[str], bytes, int, str]] = [
        ("largest grpc-timeout", [*grpc_headers, "grpc-timeout: 99999999H"], body, 0, ok),
        ("grpc-timeout in ns", [*grpc_headers, "grpc-timeout: 99999999n"], body, 0, ok),
        ("malformed grpc-timeout", [*grpc_headers, "grpc-timeout: soon"], body, 0, ok),
        ("negative grpc-timeout", [*grpc_headers, "grpc-timeout: -1S"], body, 0, ok),
        ("grpc-timeout without unit", [*grpc_headers, "grpc-timeout: 5"], body, 0, ok),
        ("90 headers", [*grpc_headers, *(f"x-many-{i}: {i}" for i in range(90))], body, 0, ok),
        ("odd grpc-accept-encoding", [*grpc_headers, "grpc-accept-encoding: ???"], body, 0, ok),
        ("non-ASCII user-agent", [*grpc_headers, "user-agent: \xff"], body, 0, ok),
        ("-bin value not base64", [*grpc_headers, "x-odd-bin: !!!"], body, 0, late),
        ("unsupported grpc-encoding", [*grpc_headers, "grpc-encoding: snappy"], body, 0, late),
        ("no te: trailers", grpc_headers[:1], body, 0, late),
        # A protocol error gRPC itself answers INTERNAL: a compressed flag with no encoding.
        (
            "compressed flag, no encoding",
            grpc_headers,
            _frame(message, compressed=True),
            0,
            internal,
        ),
        # Control characters in a header value break HTTP/2: Envoy's codec resets.
        (
            "control characters in a value",
            [*grpc_headers, "x-odd: \x01\x7f"],
            body,
            REFUSED,
            "none",
        ),
    ]
    got = {}
    for label, headers, data, exit_status, status in cases:
        got[label] = _curl_grpc(target, "/fraud.v1.FraudScoring/Score", headers, data)
        if exit_status == REFUSED:
            assert got[label][0] != 0 and got[label][1] == status, (label, got[label])
        else:
            assert got[label] == (exit_status, status), (label, got[label])
    assert _valid_call_succeeds(target, known).scored_by == pb.SCORED_BY_MODEL
