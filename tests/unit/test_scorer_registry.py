"""The scorer's model registry and its v2 servicer with the repository extension, on tiny
real ONNX models (the servicer through an in-process gRPC server)."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from inference import grpc_predict_v2_pb2 as pb
from inference import grpc_predict_v2_pb2_grpc as pb_grpc
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.common.interceptor import ErrorInterceptor
from services.models import repository
from services.models.lifecycle import ModelLifecycle
from services.models.v2 import RowRequests, fraud_probabilities, fraud_probability
from services.scorer.registry import ModelRegistry
from services.scorer.servicer import InferenceServicer

from .path_like import PATH_LIKE_NAMES, PATH_LIKE_VERSIONS
from .tiny_models import N_FEATURES, metadata, onnx_model, publish

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


def _record_filesystem(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records the path of every stat, listing and open from here on (pathlib goes
    through these; ONNX Runtime's own reads of a model file are not seen, nor needed:
    a version is only handed to it once its folder was found)."""
    seen: list[Path] = []

    def recording(function: Callable[..., Any]) -> Callable[..., Any]:
        def record(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, str | bytes | os.PathLike):
                seen.append(Path(os.fsdecode(path)))
            return function(path, *args, **kwargs)

        return record

    for module, name in (
        (os, "stat"),
        (os, "lstat"),
        (os, "listdir"),
        (os, "scandir"),
        (os, "open"),
        (io, "open"),
    ):
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    return seen


@pytest.fixture
def bait(root: Path, onnx_file: Path) -> Path:
    """Complete versions where a path-like version would lead: a sibling model's folder, a
    folder outside the repository, a symlink in the model's folder; returns the outside."""
    repository.publish(root, metadata(name="other"), {repository.MODEL_FILE: onnx_file})
    outside = root.parent / "outside"
    shutil.copytree(root / NAME / "1", outside / "1")
    (root / NAME / "latest").symlink_to("1")
    return outside


@pytest.mark.parametrize("version", [*PATH_LIKE_VERSIONS, "../other/1", "../../outside/1"])
async def test_a_path_like_version_is_refused_before_any_filesystem_access(
    root: Path, bait: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    registry = _registry(root, Clock())
    await registry.start()
    seen = _record_filesystem(monkeypatch)
    with pytest.raises(InvalidArgument):
        await registry.load(version, explicit=True)
    with pytest.raises(InvalidArgument):
        registry.unload(version)
    with pytest.raises(InvalidArgument):
        await registry.load(str(bait / "1"), explicit=True)
    assert seen == []
    assert registry.loaded() == ["1"]


async def test_an_unpublished_version_is_not_found_from_the_listing_alone(
    root: Path, bait: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = _registry(root, Clock())
    await registry.start()
    seen = _record_filesystem(monkeypatch)
    with pytest.raises(NotFound, match="published: 1, 2, 3, 4"):
        await registry.load("9", explicit=True)
    with pytest.raises(NotFound):
        registry.unload("9")
    monkeypatch.undo()
    folder = root / NAME
    assert seen, "the listing of the model's folder was not recorded"
    outside = [p for p in seen if not p.is_relative_to(folder) or ".." in p.parts]
    assert not outside, outside
    assert not any(p.name in ("9", "latest") for p in seen), seen
    # A published version that is not loaded unloads as a no-op.
    assert registry.unload("4") is False


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize("version", PATH_LIKE_VERSIONS)
async def test_repository_rpcs_refuse_path_like_versions_naming_the_parameter(
    stub: pb_grpc.GRPCInferenceServiceStub, version: str
) -> None:
    for rpc, request_type in (
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest),
    ):
        request = request_type(model_name=NAME)
        request.parameters["version"].string_param = version
        code, details = await _status(rpc(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (version, details)
        assert details.startswith("parameters[version]: "), details
        config = request_type(model_name=NAME)
        config.parameters["config"].string_param = json.dumps(
            {"version_policy": {"specific": {"versions": [1, version]}}}
        )
        code, details = await _status(rpc(config))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, (version, details)
        assert details.startswith("parameters[config].version_policy.specific.versions[1]: "), (
            details
        )
    code, details = await _status(stub.ModelInfer(_infer(version)))
    assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, "model_version")
    code, details = await _status(stub.ModelReady(pb.ModelReadyRequest(name=NAME, version=version)))
    assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, "version")
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    assert [m.version for m in index.models] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("name", PATH_LIKE_NAMES)
async def test_repository_rpcs_refuse_path_like_names(
    stub: pb_grpc.GRPCInferenceServiceStub, name: str
) -> None:
    load = pb.RepositoryModelLoadRequest(model_name=name)
    load.parameters["version"].string_param = "2"
    code, details = await _status(stub.RepositoryModelLoad(load))
    assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, "model_name")
    unload = pb.RepositoryModelUnloadRequest(model_name=name)
    code, details = await _status(stub.RepositoryModelUnload(unload))
    assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, "model_name")
    if name:
        index = pb.RepositoryIndexRequest(repository_name=name)
        code, details = await _status(stub.RepositoryIndex(index))
        assert (code, details.split(":")[0]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "repository_name",
        )


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"file:1/model.onnx": pb.ModelRepositoryParameter(bytes_param=b"x")}, "parameters["),
        ({"version": pb.ModelRepositoryParameter(int64_param=-3)}, "parameters[version]"),
        ({"version": pb.ModelRepositoryParameter(bool_param=True)}, "parameters[version]"),
        ({"config": pb.ModelRepositoryParameter(string_param="[" * 100_000)}, "parameters[config]"),
        ({"config": pb.ModelRepositoryParameter(bytes_param=b"\xff{}")}, "parameters[config]"),
        ({"config": pb.ModelRepositoryParameter(string_param="[]")}, "parameters[config]."),
        (
            {"config": pb.ModelRepositoryParameter(string_param='{"version_policy": 1}')},
            "parameters[config].",
        ),
        (
            {
                "config": pb.ModelRepositoryParameter(
                    string_param='{"version_policy": {"specific": {"versions": [true]}}}'
                )
            },
            "parameters[config].version_policy.specific.versions[0]",
        ),
    ],
)
async def test_repository_parameters_that_cannot_be_read(
    stub: pb_grpc.GRPCInferenceServiceStub,
    parameters: dict[str, pb.ModelRepositoryParameter],
    field: str,
) -> None:
    for request_type, rpc in (
        (pb.RepositoryModelLoadRequest, stub.RepositoryModelLoad),
        (pb.RepositoryModelUnloadRequest, stub.RepositoryModelUnload),
    ):
        request = request_type(model_name=NAME)
        for key, value in parameters.items():
            request.parameters[key].CopyFrom(value)
        code, details = await _status(rpc(request))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
        assert details.startswith(field), details


async def test_unknown_repository_and_unpublished_versions_are_not_found(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    code, _ = await _status(stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="x")))
    assert code is grpc.StatusCode.NOT_FOUND
    unload = pb.RepositoryModelUnloadRequest(model_name=NAME)
    unload.parameters["version"].int64_param = 9
    code, details = await _status(stub.RepositoryModelUnload(unload))
    assert code is grpc.StatusCode.NOT_FOUND, details
