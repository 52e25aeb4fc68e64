"""Versions in their own feature order, and versions trained in another state folder, taken
through the monitor's staged rollout under steady traffic through Envoy. As in
``test_rollout.py`` the gateway reads the store and runs the versions in process: over the
scorer's hop, a shared machine's pauses time out shadow and canary calls (the rollout judges
those against their allowances, this module asserts none failed).

A version folder ``fraudmesh train`` published in the session's state folder imports into
this module's own as it is, and goes live there. Then ``fraudmesh train --feature
merchant_country`` trains a candidate on this module's state with one feature more than the
serving version (the feature service serves it, the default inputs do not include it): its
model, small model and reference take the default inputs then the added one, and it goes
through shadow, canary and promotion and is rolled back, while every call is answered. That
the gateway sends each value in the version's own order, by name, is held by
``tests/unit/test_routing.py`` (and training's rows equal serving's, by name, by
``tests/unit/test_featurespec.py``); here the decision log shows it end to end: each of the
candidate's model answers is its ONNX model's score of the logged input, in which the
merchant's country code sits under ``merchant_country`` and the payment's amount under
``amount_eur`` (an input sent in another order fails that). The shadow gate and the canary's
comparisons judge the candidate as served, its likeness to live with wider yardsticks
(``ANOTHER_MODEL``: it is another model), its errors, timeouts and late answers as by default.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest

from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import faultwindow
from services.domain import featurespec
from services.domain.money import amount_eur
from services.featurestore import layout
from services.mesh import Mesh, MeshConfig
from services.models import reference, repository
from services.models.lifecycle import VersionState
from services.models.rollout import RolloutEnd
from tests.timeouts import register_logs

from .conftest import Known, first_full_quality, first_of, score_request
from .test_rollout import SHADOW_DECISIONS, STEP_DECISIONS, Traffic, World, _finished, _fraudmesh

pytestmark = pytest.mark.integration

ADDED = "merchant_country"
"""The feature the candidate takes besides the serving version's."""


@pytest.fixture(scope="module")
def world(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    logs = register_logs(request, tmp_path_factory.mktemp("feature-order-logs"))
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir,
        log_dir=logs,
        extra_env={
            "FRAUD_MONITOR_SLICE_S": "1",
            "FRAUD_MONITOR_ROLLOUT_INTERVAL_S": "0.5",
            "FRAUD_MONITOR_CHECKPOINT_INTERVAL_S": "1",
            # The controller's verdicts count late answers beyond noise; the gateway's own
            # p99 watch over one or two calls would judge the machine's pauses instead.
            "FRAUD_GATEWAY_CANARY_P99_SLACK_MS": "25",
            # The shadow gate's share scored in time would judge the machine's pauses too;
            # this module judges the order by the shadow's agreement with live.
            "FRAUD_GATEWAY_SHADOW_TIMEOUT_MS": "250",
        },
        gateway_in_process=True,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=180)
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    recent = tx[tx["timestamp"] >= tx["timestamp"].max() - pd.Timedelta(days=3)]
    traffic = Traffic(config.envoy_target, recent.sample(frac=1.0, random_state=5))
    sender = threading.Thread(target=traffic.run, name="steady-traffic", daemon=True)
    try:
        first_full_quality(config.envoy_target, known)
        sender.start()
        yield World(mesh, prepared_env.var_dir, prepared_env.model_version, traffic)
    finally:
        traffic.stop.set()
        sender.join(timeout=30)
        mesh.stop()


def _trained_candidate(world: World) -> str:
    """Trains a candidate on this module's state with ``ADDED`` besides the default inputs
    (``fraudmesh train --feature``); returns its version."""
    before = set(repository.published_versions(world.var_dir / "models"))
    out = _fraudmesh(
        "train", "--var-dir", str(world.var_dir), "--feature", ADDED, "--optional-features", "none"
    ).stdout
    print(out)
    (version,) = set(repository.published_versions(world.var_dir / "models")) - before
    return version


def _takes_the_added_feature(world: World, version: str, serving: str) -> None:
    """The published version takes the default inputs then ``ADDED``, in its metadata, both
    ONNX models and its reference; its gates ran against the serving version."""
    metadata, folder = repository.load(world.var_dir / "models", version=version)
    order = [*featurespec.MODEL_FEATURES, ADDED]
    assert ADDED not in featurespec.MODEL_FEATURES and metadata.feature_order == order
    assert metadata.params["added_features"] == ADDED
    assert set(metadata.default_features) == set(order)
    for name in (repository.MODEL_FILE, repository.SMALL_MODEL_FILE):
        (declared,) = onnx.load(folder / name).graph.input
        assert declared.type.tensor_type.shape.dim[1].dim_value == len(order), name
    assert metadata.small_model is not None
    fitted = reference.load(folder)
    assert fitted is not None and list(fitted.features) == order
    record = world.lifecycle.read().versions[version]
    assert record.state is VersionState.CANDIDATE and record.gates is not None
    assert record.gates.against == serving
    checks = {c.name: c for c in record.gates.checks}
    assert checks["parity"].passed, checks["parity"]
    # The serving version ran on the same holdout, by name (it takes fewer inputs).
    assert "cannot run live" not in checks["average_precision"].detail


def _scored_by_name(var_dir: Path, version: str, out: Path) -> int:
    """The decision log's model answers of ``version``: its ONNX model gives each logged score
    from the logged input, and each value of that input sits under its own name (the
    merchant's country code under ``ADDED``, the payment's amount under ``amount_eur``). An
    input sent in another order fails both. Returns how many answers were checked."""
    _fraudmesh("decisions", "export", "--wide", "--var-dir", str(var_dir), "--out", str(out))
    frame = pd.read_parquet(out)
    metadata, folder = repository.load(var_dir / "models", version=version)
    order = metadata.feature_order
    added_at = order.index(ADDED)
    mine = frame[(frame["model_version"] == version) & (frame["scored_by"] == "model")]
    mine = mine[[added_at not in list(m) for m in mine["missing_features"]]]
    x = mine[[f"f_{name}" for name in order]].to_numpy(dtype=np.float32)
    session = ort.InferenceSession(str(folder / repository.MODEL_FILE))
    scores = session.run([metadata.output_name], {metadata.input_name: x})[0][:, 1]
    np.testing.assert_allclose(scores, mine["score"].to_numpy(), rtol=0, atol=1e-6)
    tx = pd.read_parquet(var_dir / "data" / layout.TRANSACTIONS_FILE)
    codes = tx.groupby("merchant_id")["merchant_country"].last()
    expected = codes.loc[mine["merchant_id"]].to_numpy(dtype=np.float32)
    assert np.array_equal(mine[f"f_{ADDED}"].to_numpy(dtype=np.float32), expected)
    paid = zip(mine["amount_minor"], mine["currency"], strict=True)
    amounts = [amount_eur(int(a), str(c)) for a, c in paid]
    assert np.array_equal(
        mine["f_amount_eur"].to_numpy(dtype=np.float32), np.asarray(amounts, np.float32)
    )
    return len(mine)


ANOTHER_MODEL = (
    "min_agreement=0.5", "psi_limit=2", "rate_rel=3", "rate_abs=0.2",
    "max_decline_rate_increase=0.2",
)  # fmt: skip
"""The rollout's yardsticks of likeness to live, for a candidate that is another model: the
calls the cascade's first stage leaves to the full model are the hard ones (live reviewed 65 %
of them in one run of this module), where two models trained apart disagree on many (72 %
agreement there; its scores equal the offline model's of the logged inputs, to 1.2e-7).
Errors, timeouts and late answers are judged as by default."""


def _rollout(world: World, version: str, policy: tuple[str, ...] = ()) -> None:
    _fraudmesh(
        "model", "rollout", version, "--var-dir", str(world.var_dir),
        "--steps", "50,100", "--shadow-min-decisions", str(SHADOW_DECISIONS),
        "--step-min-decisions", str(STEP_DECISIONS), "--step-max-seconds", "120",
        *(arg for pair in policy for arg in ("--policy", pair)),
    )  # fmt: skip
    plan = _finished(world, 300)
    for result in plan.results:
        print(f"{result.step}: {result.summary()}")
    assert plan.outcome is RolloutEnd.PROMOTED, plan.reason
    assert [r.step for r in plan.results] == ["shadow", "canary 50%"]
    for result in plan.results[1:]:
        (errors,) = [c for c in result.comparisons if c.name == "errors and timeouts"]
        assert errors.candidate == 0.0, result.summary()
    assert world.lifecycle.read().routing.live == version


def _answered_by(world: World, known: Known, version: str) -> None:
    """Waits until the gateway answers by ``version``'s model (the routing has reached it)."""
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(world.mesh.config.envoy_target) as channel:
        stub = pb_grpc.FraudScoringStub(channel)
        while True:
            answer = first_of(
                lambda: stub.Score(score_request(known, amount_minor=900_000), timeout=2.0),
                lambda a: a.model_version == version,
            )
            if answer.model_version == version:
                return
            assert time.monotonic() < deadline, f"still answered by {answer.model_version}"
            time.sleep(0.5)


def _no_call_failed(world: World, before: tuple[int, int, int]) -> None:
    """Calls since ``before`` (answered, failed, latencies seen) failed or were late no more
    than the same run's calls before them did (``loadtest.faultwindow``)."""
    _, failed, seen = before
    baseline = world.traffic.elapsed_ms[:seen]
    during = world.traffic.elapsed_ms[seen:]
    failed_during = sum(world.traffic.failed.values()) - failed
    budget = faultwindow.BUDGET_MS
    verdict = faultwindow.judge(
        faultwindow.Tally(len(baseline) + failed, failed + sum(e > budget for e in baseline)),
        faultwindow.Tally(
            len(during) + failed_during, failed_during + sum(e > budget for e in during)
        ),
    )
    print(
        f"{len(during)} answered, {failed_during} failed at the client "
        f"(by code, since the start: {world.traffic.failed}): {verdict}"
    )
    assert verdict.ok, verdict


def _mark(world: World) -> tuple[int, int, int]:
    traffic = world.traffic
    return traffic.answered, sum(traffic.failed.values()), len(traffic.elapsed_ms)


def test_a_version_trained_in_another_state_folder_imports_as_published_and_goes_live(
    world: World, prepared_state: Any, known: Known
) -> None:
    published = prepared_state.model_root / repository.DEFAULT_MODEL_NAME
    folder = published / prepared_state.model_version
    trained, _ = repository.load(prepared_state.model_root, version=prepared_state.model_version)
    assert trained.small_model is not None, "training published no small model"
    before = set(repository.published_versions(world.var_dir / "models"))
    out = _fraudmesh("model", "import", str(folder), "--var-dir", str(world.var_dir)).stdout
    print(out)
    # The calls so far, the import's busy minute among them, are the baseline of the rollout.
    mark = _mark(world)
    (version,) = set(repository.published_versions(world.var_dir / "models")) - before
    record = world.lifecycle.read().versions[version]
    assert record.state is VersionState.CANDIDATE and record.gates is not None
    assert record.gates.passed, record.gates
    imported, imported_folder = repository.load(world.var_dir / "models", version=version)
    # As published: the same model file, feature order and thresholds; the library versions
    # kept; a small model along, its clear-approve threshold chosen again here.
    assert (imported_folder / repository.MODEL_FILE).read_bytes() == (
        folder / repository.MODEL_FILE
    ).read_bytes()
    assert imported.feature_order == trained.feature_order
    assert imported.thresholds == trained.thresholds
    assert imported.lightgbm_version == trained.lightgbm_version != ""
    assert imported.small_model is not None
    _rollout(world, version)
    _answered_by(world, known, version)
    _no_call_failed(world, mark)
    world.live = version


def test_a_version_trained_with_one_more_feature_rolls_out_and_back(
    world: World, known: Known, tmp_path: Path
) -> None:
    serving = world.live
    version = _trained_candidate(world)
    _takes_the_added_feature(world, version, serving)
    # Training's busy minute is in the baseline, as the import's is.
    mark = _mark(world)
    _rollout(world, version, ANOTHER_MODEL)
    state = world.lifecycle.read()
    mine = [t.reason for t in state.history if t.version == version]
    assert any(r.startswith("shadow gate passed: decision agreement") for r in mine), mine
    _answered_by(world, known, version)
    _fraudmesh("model", "rollback", "--var-dir", str(world.var_dir), "--reason", "test")
    state = world.lifecycle.read()
    assert state.routing.live == serving
    assert state.versions[version].state is VersionState.RETIRED
    _answered_by(world, known, serving)
    _no_call_failed(world, mark)
    # What the candidate answered while it served was its model's score of its own input,
    # every value under its own name.
    checked = _scored_by_name(world.var_dir, version, tmp_path / "decisions.parquet")
    print(f"{checked} of the candidate's model answers checked by name")
    assert checked >= 10, checked
