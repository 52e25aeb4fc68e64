"""Models a team brings, taken through the monitor's staged rollout under steady traffic
through Envoy: ``fraudmesh model import`` publishes each (validated, with a reference and
gates); a good candidate goes shadow → canary steps → live on its own with every step in the
history; one with higher thresholds is rolled back at its first canary step naming the
decision rates; one whose scores are shifted (same ranking, another scale) is stopped by the
shadow gate naming the PSI. Steps are short (a few hundred decisions each) and every verdict
rests on decision counts, never on how fast the machine is."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import helper, numpy_helper

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import faultwindow
from services.domain import featurespec
from services.featurestore import layout
from services.mesh import Mesh, MeshConfig
from services.models import repository
from services.models.lifecycle import ModelLifecycle, VersionState
from services.models.rollout import RolloutEnd, RolloutFile, RolloutPlan
from tests.timeouts import register_logs

from .conftest import Known, first_full_quality

pytestmark = pytest.mark.integration

RATE = 120
"""Calls a second, steady, for as long as the module runs."""
STEP_DECISIONS = 200
"""Decisions each arm needs before a canary step is judged."""
SHADOW_DECISIONS = 500
"""Answers the shadow must score before the shadow gate judges."""


@dataclass
class Traffic:
    """Steady traffic through Envoy on a thread of its own, and what it got back."""

    target: str
    rows: pd.DataFrame
    answered: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    elapsed_ms: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Sends one call every 1/RATE s (up to eight in flight) until stopped."""
        lock = threading.Lock()
        numbered = iter(range(1 << 40))
        start = time.monotonic()
        rows = list(self.rows.itertuples(index=False))
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)

            def one(_: int) -> None:
                with lock:
                    i = next(numbered)
                time.sleep(max(0.0, start + i / RATE - time.monotonic()))
                request = _request(rows[i % len(rows)], f"rollout-{i}")
                try:
                    response = stub.Score(request, timeout=2.0)
                except grpc.RpcError as error:
                    with lock:
                        code = error.code().name
                        self.failed[code] = self.failed.get(code, 0) + 1
                    return
                with lock:
                    self.answered += 1
                    self.elapsed_ms.append(response.elapsed_ms)

            with ThreadPoolExecutor(8) as pool:
                while not self.stop.is_set():
                    list(pool.map(one, range(64)))


def _request(row: Any, transaction_id: str) -> pb.ScoreRequest:
    request = pb.ScoreRequest(
        transaction_id=transaction_id,
        card_id=str(row.card_id),
        merchant_id=str(row.merchant_id),
        amount_minor=int(row.amount_minor),
        currency=str(row.currency),
        channel=pb.CHANNEL_CARD_NOT_PRESENT
        if row.channel == featurespec.CARD_NOT_PRESENT
        else pb.CHANNEL_CARD_PRESENT,
    )
    if isinstance(row.terminal_id, str):
        request.terminal_id = row.terminal_id
    request.timestamp.FromNanoseconds(time.time_ns())
    return request


@dataclass
class World:
    """The mesh, its model folder and the traffic running through it."""

    mesh: Mesh
    var_dir: Path
    live: str
    traffic: Traffic

    @property
    def lifecycle(self) -> ModelLifecycle:
        return ModelLifecycle(self.var_dir / "models")

    @property
    def plans(self) -> RolloutFile:
        return RolloutFile(self.var_dir / "models")


@pytest.fixture(scope="module")
def world(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    logs = register_logs(request, tmp_path_factory.mktemp("rollout-logs"))
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir,
        log_dir=logs,
        extra_env={
            # Steps of seconds: slices of one second, and the controller looks twice a second.
            "FRAUD_MONITOR_SLICE_S": "1",
            "FRAUD_MONITOR_ROLLOUT_INTERVAL_S": "0.5",
            "FRAUD_MONITOR_CHECKPOINT_INTERVAL_S": "1",
            # The gateway's own watch compares the model-call p99 of the canary's first
            # hundred calls, one or two calls, which a pause of a shared machine decides (it
            # rolled an identical canary back here: 6.0 ms vs 0.4 ms). This module judges
            # the controller's verdicts, which count late answers beyond noise instead.
            "FRAUD_GATEWAY_CANARY_P99_SLACK_MS": "25",
        },
        gateway_in_process=True,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=180)
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    recent = tx[tx["timestamp"] >= tx["timestamp"].max() - pd.Timedelta(days=3)]
    traffic = Traffic(config.envoy_target, recent.sample(frac=1.0, random_state=3))
    sender = threading.Thread(target=traffic.run, name="steady-traffic", daemon=True)
    try:
        first_full_quality(config.envoy_target, known)
        sender.start()
        yield World(mesh, prepared_env.var_dir, prepared_env.model_version, traffic)
    finally:
        traffic.stop.set()
        sender.join(timeout=30)
        mesh.stop()


def _fraudmesh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


def _bring(
    world: World,
    folder: Path,
    onnx_bytes: bytes | None = None,
    small: bool = False,
    **thresholds: float,
) -> Path:
    """A folder as a team trained elsewhere would bring it: the live model's ONNX file (or
    ``onnx_bytes``) and metadata, with ``thresholds`` changed; with ``small``, the live
    version's small model too."""
    metadata, live_folder = repository.load(world.var_dir / "models", version=world.live)
    folder.mkdir(parents=True)
    data = onnx_bytes or (live_folder / repository.MODEL_FILE).read_bytes()
    (folder / repository.MODEL_FILE).write_bytes(data)
    spec: dict[str, object] = {
        "feature_order": metadata.feature_order,
        "input_name": metadata.input_name,
        "output_name": metadata.output_name,
        "thresholds": metadata.thresholds.model_dump() | thresholds,
        "default_features": metadata.default_features,
        "params": {"team": "payments-risk"},
    }
    if small:
        assert metadata.small_model is not None, "the live version has no small model"
        small_file = repository.SMALL_MODEL_FILE
        (folder / small_file).write_bytes((live_folder / small_file).read_bytes())
        spec["small_model"] = metadata.small_model.model_dump(
            include={"kind", "trees", "num_leaves", "max_depth"}
        )
    (folder / "metadata.json").write_text(json.dumps(spec))
    return folder


def _import(world: World, folder: Path) -> str:
    before = set(repository.published_versions(world.var_dir / "models"))
    started = time.monotonic()
    out = _fraudmesh("model", "import", str(folder), "--var-dir", str(world.var_dir)).stdout
    print(out, f"(import took {time.monotonic() - started:.1f} s)")
    (version,) = set(repository.published_versions(world.var_dir / "models")) - before
    return version


def _finished(world: World, timeout_s: float) -> RolloutPlan:
    deadline = time.monotonic() + timeout_s
    while True:
        plan = world.plans.read()
        if plan is not None and plan.finished:
            return plan
        assert time.monotonic() < deadline, (
            f"rollout not finished: {plan.where() if plan else None}"
        )
        time.sleep(0.25)


def _shifted(onnx_bytes: bytes, power: float) -> bytes:
    """The same model with its probabilities raised to ``power``: the same ranking, scores
    on another scale."""
    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    (output,) = [o for o in graph.output if o.name == "probabilities"]
    graph.initializer.append(
        numpy_helper.from_array(np.array(power, dtype=np.float32), "shift_power")
    )
    for node in graph.node:
        node.output[:] = ["raw_probabilities" if o == "probabilities" else o for o in node.output]
    graph.node.append(
        helper.make_node("Pow", ["raw_probabilities", "shift_power"], ["probabilities"])
    )
    del output  # the graph's output keeps its name and shape; its producer changed
    return model.SerializeToString()


def test_import_refuses_a_bad_folder_and_publishes_nothing(world: World, tmp_path: Path) -> None:
    folder = _bring(world, tmp_path / "bad", review=0.3, decline=1.0)
    before = repository.published_versions(world.var_dir / "models")
    done = _fraudmesh("model", "import", str(folder), "--var-dir", str(world.var_dir), check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "import rejected: metadata.json thresholds.decline is 1, not inside (0, 1)"
    ]
    assert repository.published_versions(world.var_dir / "models") == before


def test_a_good_candidate_goes_live_on_its_own(world: World, tmp_path: Path) -> None:
    version = _import(world, _bring(world, tmp_path / "good", small=True))
    record = world.lifecycle.read().versions[version]
    assert record.state is VersionState.CANDIDATE and record.gates is not None
    assert record.gates.passed, record.gates
    # The small model came along; its clear-approve threshold was chosen on this store's
    # validation period against the imported model, as training chooses it.
    imported, _ = repository.load(world.var_dir / "models", version=version)
    live, _ = repository.load(world.var_dir / "models", version=world.live)
    assert imported.small_model is not None and live.small_model is not None
    assert 0.0 <= imported.small_model.clear_approve <= imported.thresholds.review
    assert (
        imported.metrics["cascade_review_frauds"] >= imported.metrics["cascade_review_frauds_lost"]
    )
    assert (
        world.var_dir / "models" / repository.DEFAULT_MODEL_NAME / version / "reference.json"
    ).is_file()
    failed_before = sum(world.traffic.failed.values())
    baseline = list(world.traffic.elapsed_ms)
    started = time.monotonic()
    _fraudmesh(
        "model", "rollout", version, "--var-dir", str(world.var_dir),
        "--steps", "25,50,100", "--shadow-min-decisions", str(SHADOW_DECISIONS),
        "--step-min-decisions", str(STEP_DECISIONS), "--step-max-seconds", "120",
    )  # fmt: skip
    plan = _finished(world, 300)
    took = time.monotonic() - started
    for result in plan.results:
        print(f"{result.step}: {result.summary()}")
    assert plan.outcome is RolloutEnd.PROMOTED, plan.reason
    assert [r.step for r in plan.results] == ["shadow", "canary 25%", "canary 50%"]
    state = world.lifecycle.read()
    assert state.routing.live == version and state.routing.previous == world.live
    mine = [t for t in state.history if t.version == version]
    reasons = [t.reason for t in mine]
    assert any(r.startswith("shadow gate passed: decision agreement") for r in reasons)
    assert any(r.startswith("canary 25% passed: errors and timeouts") for r in reasons)
    assert reasons[-1] == "promoted: staged rollout: 2 canary steps passed"
    # No card the candidate was routed to failed: the monitor counts every card a canary
    # could not answer (DecisionEvent.canary_failed_version), and none did at any step.
    for result in plan.results[1:]:
        (errors,) = [c for c in result.comparisons if c.name == "errors and timeouts"]
        assert errors.candidate == 0.0, result.summary()
    # Calls the client itself gave up on (its 2 s deadline) carry no answer to attribute to an
    # arm; on a shared machine they come and go with its load, before and during alike.
    failed_during = sum(world.traffic.failed.values()) - failed_before
    during_calls = len(world.traffic.elapsed_ms) - len(baseline) + failed_during
    print(
        f"calls failed at the client: {failed_during} of {during_calls} during the rollout, "
        f"{failed_before} of {len(baseline) + failed_before} before it"
    )
    # No call failed or was late because of the rollout: the calls from the rollout's start
    # to its end are judged against the same run's calls before it (loadtest.faultwindow).
    during = world.traffic.elapsed_ms[len(baseline) :]
    verdict = faultwindow.judge(
        faultwindow.Tally(
            len(baseline) + failed_before,
            failed_before + sum(e > faultwindow.BUDGET_MS for e in baseline),
        ),
        faultwindow.Tally(
            during_calls, failed_during + sum(e > faultwindow.BUDGET_MS for e in during)
        ),
    )
    assert verdict.ok, f"during the rollout: {verdict}"
    listing = _fraudmesh("model", "list", "--var-dir", str(world.var_dir)).stdout
    assert f"rollout of v{version}: promoted" in listing
    answers = np.asarray(world.traffic.elapsed_ms[len(baseline) :])
    print(
        f"good candidate live after {took:.0f} s; {world.traffic.answered} calls answered; "
        f"gateway p99 {np.percentile(answers, 99):.1f} ms during the rollout, "
        f"{np.percentile(baseline, 99):.1f} ms before it; over 42 ms: "
        f"{np.mean(answers > 42):.2%} vs {np.mean(np.asarray(baseline) > 42):.2%}"
    )
    # The next tests roll out against this version.
    world.live = version


def test_higher_thresholds_are_rolled_back_at_the_first_step(world: World, tmp_path: Path) -> None:
    version = _import(world, _bring(world, tmp_path / "lenient", review=0.97, decline=0.995))
    _fraudmesh(
        "model", "rollout", version, "--var-dir", str(world.var_dir),
        "--steps", "50,100", "--shadow-min-decisions", "0",
        "--step-min-decisions", str(STEP_DECISIONS), "--step-max-seconds", "120",
    )  # fmt: skip
    plan = _finished(world, 200)
    print(plan.reason)
    assert plan.outcome is RolloutEnd.ROLLED_BACK
    assert plan.reason.startswith("rolled back at canary 50%:")
    # Higher thresholds move the decision mix: fewer reviews and declines, so more approvals.
    # Which of the three rates breaches first depends on the window's draw; any of them is
    # this candidate's fault, and errors or latency are not.
    assert any(f"{rate} rate" in plan.reason for rate in ("approve", "review", "decline"))
    assert [r.step for r in plan.results] == ["canary 50%"]
    state = world.lifecycle.read()
    assert state.routing.canary is None and state.routing.live == world.live
    assert state.versions[version].state is VersionState.RETIRED
    assert "rate" in state.versions[version].reason


def test_shifted_scores_are_stopped_by_the_shadow_gate(world: World, tmp_path: Path) -> None:
    _, live_folder = repository.load(world.var_dir / "models", version=world.live)
    shifted = _shifted((live_folder / repository.MODEL_FILE).read_bytes(), 0.4)
    version = _import(world, _bring(world, tmp_path / "shifted", onnx_bytes=shifted))
    done = _fraudmesh(
        "model", "shadow", version, "--var-dir", str(world.var_dir),
        "--min-decisions", str(SHADOW_DECISIONS), "--max-seconds", "120", "--wait",
        check=False,
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 1, done.stderr
    plan = world.plans.read()
    assert plan is not None and plan.outcome is RolloutEnd.SHADOW_FAILED
    assert "score PSI" in plan.reason
    record = world.lifecycle.read().versions[version]
    assert record.state is VersionState.RETIRED and "score PSI" in record.reason
