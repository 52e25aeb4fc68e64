"""The scorer's model registry and its v2 servicer with the repository extension, on tiny
real ONNX models (the servicer through an in-process gRPC server)."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from inference import grpc_predict_v2_pb2 as pb
from inference import grpc_predict_v2_pb2_grpc as pb_grpc
from services.common.errors import FailedPrecondition, NotFound
from services.common.interceptor import ErrorInterceptor
from services.models import repository
from services.models.lifecycle import ModelLifecycle
from services.models.v2 import RowRequests, fraud_probabilities, fraud_probability
from services.scorer.registry import ModelRegistry
from services.scorer.servicer import InferenceServicer

from .tiny_models import N_FEATURES, onnx_model, publish

NAME = repository.DEFAULT_MODEL_NAME


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onnx_model(tmp_path_factory.mktemp("tiny") / "model.onnx")


@pytest.fixture
def root(tmp_path: Path, onnx_file: Path) -> Path:
    """Live v1, candidates v2, v3 and v4."""
    root = tmp_path / "models"
    publish(root, onnx_file, candidate=False)
    for _ in range(3):
        publish(root, onnx_file)
    return root


def _registry(root: Path, clock: Clock) -> ModelRegistry:
    return ModelRegistry(root, NAME, warmup_calls=2, unload_grace_s=10.0, clock=clock)


async def test_start_loads_what_the_lifecycle_routes(root: Path) -> None:
    lifecycle = ModelLifecycle(root)
    lifecycle.canary("2", 10)
    lifecycle.shadow("3")
    registry = _registry(root, Clock())
    await registry.start()
    assert registry.loaded() == ["1", "2", "3"]
    assert registry.default_version == "1"
    assert registry.get(NAME, "").version == "1"
    assert registry.get(NAME, "2").version == "2"
    with pytest.raises(NotFound, match="not loaded"):
        registry.get(NAME, "4")
    with pytest.raises(NotFound, match="not served here"):
        registry.get("other", "")


async def test_follows_promotion_and_unloads_after_the_grace_period(root: Path) -> None:
    clock = Clock()
    registry = _registry(root, clock)
    await registry.start()
    lifecycle = ModelLifecycle(root)
    lifecycle.canary("2", 50)
    await registry.refresh()
    assert registry.loaded() == ["1", "2"]
    lifecycle.promote("2")
    lifecycle.retire("1")  # no longer kept for rollback
    await registry.refresh()
    assert registry.default_version == "2"
    assert registry.loaded() == ["1", "2"], "unloaded before the grace period"
    clock.now = 10.0
    await registry.refresh()
    assert registry.loaded() == ["2"]


async def test_explicit_loads_stay_until_unloaded(root: Path) -> None:
    clock = Clock()
    registry = _registry(root, clock)
    await registry.start()
    await registry.load("4", explicit=True)
    clock.now = 100.0
    await registry.refresh(force=True)
    assert "4" in registry.loaded()
    with pytest.raises(FailedPrecondition, match="carries traffic"):
        registry.unload("1")
    assert registry.unload_idle() == ["4"]
    assert registry.loaded() == ["1"]


async def test_index_reports_load_state_and_lifecycle(root: Path) -> None:
    ModelLifecycle(root).canary("2", 20)
    registry = _registry(root, Clock())
    await registry.start()
    entries = {e.version: (e.state, e.reason) for e in registry.index()}
    assert entries == {
        "1": ("READY", "live 80%"),
        "2": ("READY", "canary 20%"),
        "3": ("UNAVAILABLE", "candidate"),
        "4": ("UNAVAILABLE", "candidate"),
    }
    assert [e.version for e in registry.index(ready_only=True)] == ["1", "2"]


@pytest.fixture
async def stub(root: Path) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    registry = _registry(root, Clock())
    await registry.start()
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(registry), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)
    await server.stop(0)


def _infer(version: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=NAME, model_version=version)
    request.inputs.add(name="input", datatype="FP32", shape=[1, N_FEATURES])
    request.raw_input_contents.append(struct.pack(f"<{N_FEATURES}f", *([0.0] * N_FEATURES)))
    return request


async def test_repository_extension_loads_serves_and_unloads(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    metadata = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert "model_repository" in metadata.extensions
    assert (await stub.ModelInfer(_infer(""))).model_version == "1"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ModelInfer(_infer("3"))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND

    load = pb.RepositoryModelLoadRequest(model_name=NAME)
    load.parameters["version"].string_param = "3"
    await stub.RepositoryModelLoad(load)
    # What Triton clients send: a model configuration with a specific version policy.
    load = pb.RepositoryModelLoadRequest(model_name=NAME)
    load.parameters["config"].string_param = json.dumps(
        {"version_policy": {"specific": {"versions": [4]}}}
    )
    await stub.RepositoryModelLoad(load)
    assert (await stub.ModelInfer(_infer("3"))).model_version == "3"
    assert (await stub.ModelReady(pb.ModelReadyRequest(name=NAME, version="4"))).ready

    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert [(m.name, m.version, m.state) for m in index.models] == [
        (NAME, "1", "READY"),
        (NAME, "3", "READY"),
        (NAME, "4", "READY"),
    ]

    unload = pb.RepositoryModelUnloadRequest(model_name=NAME)
    unload.parameters["version"].int64_param = 3
    await stub.RepositoryModelUnload(unload)
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name=NAME, version="3"))).ready

    live = pb.RepositoryModelUnloadRequest(model_name=NAME)
    live.parameters["version"].string_param = "1"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RepositoryModelUnload(live)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    missing = pb.RepositoryModelLoadRequest(model_name=NAME)
    missing.parameters["version"].string_param = "9"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RepositoryModelLoad(missing)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="other"))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


async def test_a_batch_of_rows_is_scored_like_single_rows(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    rows = RowRequests(NAME, "1", "input", N_FEATURES, "probabilities")
    vectors = [[float(i + j) / 10 for j in range(N_FEATURES)] for i in range(3)]
    batch = fraud_probabilities(await stub.ModelInfer(rows.batch(vectors)), 3)
    single = [fraud_probability(await stub.ModelInfer(rows.request(v))) for v in vectors]
    assert batch == pytest.approx(single, abs=1e-7)
