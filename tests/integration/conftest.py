"""Fixtures that run the real mesh (Envoy, gateway, features, scorer, redis-server) on free ports.

A mesh a fixture hands out has given its first full-quality answer (the model on online
features), so no test judges a mesh still warming. A test that fails (a timeout included)
carries the last lines of its meshes' logs once each (``tests/timeouts.py``): those of the
meshes it is handed, and those of the meshes its module starts in a folder given to
``register_logs``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pandas as pd
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig
from tests.timeouts import register_logs

T = TypeVar("T")

FULL_QUALITY_WAIT_S = 60.0
"""How long a fresh mesh may take to give its first full-quality answer."""

ANSWER_DEADLINE_S = 10.0
"""The deadline of a single call that judges an answer, not its speed. Such a call often opens
its channel, so the deadline covers the connection too; while the other lanes hold both cores
a 1 s deadline ran out. Calls that judge latency keep the budget's own deadlines."""

CASCADE_ENV = "FRAUD_GATEWAY_CASCADE"
"""The gateway setting that turns the cascade's first stage on or off."""


@pytest.fixture(scope="session", autouse=True)
def full_path_by_default() -> Iterator[None]:
    """The meshes these tests start run without the cascade's first stage (their processes
    inherit this environment): the tests that judge the scorer's path (scores equal to the
    scorer's, traces through it, recovery probes waiting for the model) need every
    transaction to reach it. test_cascade.py runs the cascade, the product's default, by
    naming it; the small model's fallback is on either way."""
    previous = os.environ.get(CASCADE_ENV)
    os.environ.setdefault(CASCADE_ENV, "false")
    yield
    if previous is None:
        os.environ.pop(CASCADE_ENV, None)


@dataclass(frozen=True)
class Known:
    """Entities that exist in the simulated data."""

    card_id: str
    merchant_id: str
    amount_minor: int
    terminal_id: str


@pytest.fixture(scope="session")
def known(prepared_state: Any) -> Known:
    """A busy card, a merchant it uses, a typical amount of it, and that merchant's busiest
    terminal (every module's copy of the prepared state has the same data)."""
    tx = pd.read_parquet(prepared_state.data_dir / layout.TRANSACTIONS_FILE)
    tx = tx[tx["currency"] == "EUR"]
    card = tx["card_id"].value_counts().index[0]
    mine = tx[tx["card_id"] == card]
    merchant = str(mine["merchant_id"].value_counts().index[0])
    terminals = tx.loc[tx["merchant_id"] == merchant, "terminal_id"]
    return Known(
        card_id=str(card),
        merchant_id=merchant,
        amount_minor=int(mine["amount_minor"].median()),
        terminal_id=str(terminals.value_counts().index[0]),
    )


def score_request(known: Known, **overrides: object) -> pb.ScoreRequest:
    """A payment of the known card at its merchant, stamped now; ``overrides`` change fields."""
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    fields: dict[str, object] = {
        "transaction_id": f"t-{time.time_ns()}",
        "card_id": known.card_id,
        "merchant_id": known.merchant_id,
        "amount_minor": known.amount_minor,
        "currency": "EUR",
        "timestamp": ts,
    }
    fields.update(overrides)
    return pb.ScoreRequest(**fields)  # type: ignore[arg-type]


def full_quality(
    score: Callable[[], pb.ScoreResponse],
    scored_by: pb.ScoredBy.ValueType = pb.SCORED_BY_MODEL,
    source: pb.FeatureSource.ValueType = pb.FEATURE_SOURCE_ONLINE,
    timeout_s: float = 10.0,
) -> pb.ScoreResponse:
    """The first answer of ``score`` (one call per try) given by ``scored_by`` on ``source``
    features; fails the test with the last answer or error when none comes in ``timeout_s``.

    On a loaded machine one call may miss its slice of the budget and be answered by a
    fallback, which is right, but not what a test waiting for this judges."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            answer = score()
        except grpc.RpcError as error:
            last = f"{error.code().name}: {error.details()}"  # type: ignore[attr-defined]
        else:
            if answer.scored_by == scored_by and answer.feature_source == source:
                return answer
            last = answer
        if time.monotonic() > deadline:
            pytest.fail(f"no answer by {scored_by} on {source} features in {timeout_s} s: {last}")
        time.sleep(0.1)


@dataclass
class Recorder:
    """Makes calls through ``call`` and keeps every answer with the milliseconds the client
    waited for it."""

    call: Callable[[], pb.ScoreResponse]
    seen: list[tuple[pb.ScoreResponse, float]] = field(default_factory=list)

    def __call__(self) -> pb.ScoreResponse:
        began = time.perf_counter()
        answer = self.call()
        self.seen.append((answer, (time.perf_counter() - began) * 1000))
        return answer

    def answers(self) -> list[pb.ScoreResponse]:
        """Every answer so far."""
        return [answer for answer, _ in self.seen]

    def elapsed_is_consistent(self) -> bool:
        """Each answer's ``elapsed_ms`` (the gateway's own time) is positive and within what
        the client waited: whether that fits the budget is judged over many calls against a
        baseline (the fault matrix), never on one call."""
        return all(0.0 < answer.elapsed_ms <= waited for answer, waited in self.seen)


def first_of(call: Callable[[], T], wanted: Callable[[T], bool], tries: int = 5) -> T:
    """The first of up to ``tries`` results of ``call`` that is ``wanted``, else the last one;
    a call that ends DEADLINE_EXCEEDED is tried again (raised when it is the last try). A
    client's one call may meet a fallback or miss its deadline on a loaded machine; five in
    a row do not."""
    for attempt in range(1, tries + 1):
        try:
            result = call()
        except grpc.RpcError as error:
            late = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
            if not late or attempt == tries:
                raise
        else:
            if wanted(result) or attempt == tries:
                return result
        time.sleep(0.2)
    raise AssertionError("unreachable")


def first_full_quality(
    target: str, known: Known, channel: Callable[[str], grpc.Channel] = grpc.insecure_channel
) -> pb.ScoreResponse:
    """Waits for a fresh mesh's first answer by the model on online features."""
    with channel(target) as opened:
        stub = pb_grpc.FraudScoringStub(opened)
        return full_quality(
            lambda: stub.Score(score_request(known), timeout=1.0), timeout_s=FULL_QUALITY_WAIT_S
        )


def start_mesh(
    prepared_env: Any, log_dir: Path, store: str = "sqlite", known: Known | None = None, **env: str
) -> Mesh:
    """Starts a mesh on the prepared data; with Redis, materializes into the fresh server.
    With ``known``, returns once the mesh has answered at full quality."""
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir, store=store, log_dir=log_dir, extra_env=env
    )
    mesh = Mesh(config)

    def ready(name: str) -> None:
        if name == "redis":
            settings = FeatureStoreSettings(
                var_dir=prepared_env.var_dir,
                store="redis",
                redis_connection=f"{config.host}:{config.redis_port}",
            )
            store_admin.materialize(settings)

    mesh.start(timeout_s=120, on_ready=ready)
    if known is not None:
        try:
            first_full_quality(config.envoy_target, known)
        except BaseException:
            mesh.stop()
            raise
    return mesh


@pytest.fixture(scope="module")
def mesh(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    """A mesh on the embedded SQLite store, shared by a test module."""
    logs = register_logs(request, tmp_path_factory.mktemp("mesh-logs"))
    m = start_mesh(prepared_env, logs, known=known)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def edge(mesh: Mesh) -> Iterator[grpc.Channel]:
    """A channel to the mesh's Envoy listener."""
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield channel


def go_tool(name: str) -> str:
    """Path of a tool installed by scripts/tools.sh (PATH or GOPATH/bin); fails if absent."""
    found = shutil.which(name) or shutil.which(name, path=str(Path.home() / "go" / "bin"))
    if found is None:
        pytest.fail(f"{name} is not installed: run `make tools`")
    return found
