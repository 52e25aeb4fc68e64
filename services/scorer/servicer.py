"""Open Inference Protocol v2 servicer: protos in, the model registry and ONNX Runtime, protos out.

Besides inference it implements the model repository extension as Triton defines it
(``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``). Load and
unload name the version with a parameter: ``version`` (a string or integer, this
server's convention) or ``config``, a JSON model configuration whose
``version_policy.specific.versions`` lists the versions (what Triton clients send).
Without one, load re-reads the lifecycle and loads every version it needs, and unload
unloads every loaded version that carries no traffic.

Names and versions are client values that the repository turns into folder names: one
that is not a plain model name or version number (separators, ``..``, an absolute path,
NUL, over-long, a sign or a non-digit in a version) is INVALID_ARGUMENT naming the field,
decided before anything is looked up on disk; a plain one that is not published is
NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping

import grpc
import numpy as np

from inference import grpc_predict_v2_pb2 as pb
from inference import grpc_predict_v2_pb2_grpc as pb_grpc
from services.common import telemetry
from services.common.errors import (
    DeadlineExceeded,
    FraudmeshError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from services.common.rpc_observer import observe_message
from services.common.streaming import answer_concurrently, held_open
from services.domain.validation import shown
from services.models import repository
from services.models.onnx import OnnxModel
from services.models.v2 import TRACEPARENTS
from services.scorer.registry import ModelRegistry

log = logging.getLogger(__name__)

SERVER_NAME = "fraudmesh-scorer"
SERVER_VERSION = "0.1.0"
PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["model_repository"]
"""Protocol extensions this server implements."""

_NUMPY = {
    "FP32": np.float32,
    "FP64": np.float64,
    "INT64": np.int64,
    "INT32": np.int32,
}
_CONTENTS_FIELD = {
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "INT64": "int64_contents",
    "INT32": "int_contents",
}


_STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def _reply_code(reply: pb.ModelStreamInferResponse) -> int:
    """The status code number of a stream reply ("STATUS_NAME: message" on errors)."""
    if not reply.error_message:
        return 0
    name = reply.error_message.partition(":")[0]
    return grpc.StatusCode[name].value[0] if name in grpc.StatusCode.__members__ else 2


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Serves the versions loaded in the registry; other names or versions are NOT_FOUND."""

    def __init__(
        self,
        registry: ModelRegistry | None = None,
        fault_delay_s: float = 0.0,
        fault_versions: frozenset[str] = frozenset(),
        observe: bool = True,
    ) -> None:
        self.registry = registry
        self._fault_delay_s = fault_delay_s
        self._fault_versions = fault_versions
        self._observe = observe
        self._observe_message = observe_message(_STREAM_METHOD)

    def _registry(self) -> ModelRegistry:
        registry = self.registry
        if registry is None:
            raise Unavailable("models are still loading")
        return registry

    def _model(self, name: str, version: str, fields: tuple[str, str]) -> OnnxModel:
        """The loaded model; ``fields`` name the request's name and version fields."""
        try:
            return self._registry().get(name, version)
        except NotFound:
            # Only on a miss: the request path pays nothing for telling bad from unknown.
            _check_model_id(name, version, fields)
            raise

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        registry = self.registry
        return pb.ServerReadyResponse(ready=registry is not None and bool(registry.loaded()))

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        registry = self.registry
        ready = registry is not None and registry.ready(request.name, request.version)
        if not ready:
            _check_model_id(request.name, request.version, ("name", "version"))
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
        )

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        model = self._model(request.name, request.version, ("name", "version"))
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=model.name,
            versions=self._registry().loaded(),
            platform=PLATFORM,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in model.inputs],
            outputs=[
                tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in model.outputs
            ],
        )

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        model = self._infer_model(request)
        if self._fault_delay_s and (
            not self._fault_versions or model.version in self._fault_versions
        ):
            await asyncio.sleep(self._fault_delay_s)
        return _infer(model, request)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answers each request on the stream with its id; a failed request gets an error
        reply and the stream goes on. Requests are answered inline, in order (one row costs
        microseconds: docs/performance.md); with an injected delay, concurrently, as unary
        calls would be."""
        # Headers first: the client knows the stream is open before it sends anything.
        await context.send_initial_metadata(())
        with held_open():
            if not self._fault_delay_s:
                async for request in request_iterator:
                    arrived = time.monotonic()
                    reply = self._stream_reply(request, arrived)
                    self._answered(reply, arrived)
                    yield reply
                return

            async def answer(
                request: pb.ModelInferRequest, arrived: float
            ) -> pb.ModelStreamInferResponse:
                if self._delayed(request):
                    await asyncio.sleep(self._fault_delay_s)
                return self._stream_reply(request, arrived)

            async for reply in answer_concurrently(request_iterator, answer, self._answered):
                yield reply

    def _answered(self, reply: pb.ModelStreamInferResponse, arrived: float) -> None:
        """Observes one streamed request's latency, with its reply's status."""
        if self._observe:
            self._observe_message(time.monotonic() - arrived, _reply_code(reply))

    def _delayed(self, request: pb.ModelInferRequest) -> bool:
        return not self._fault_versions or request.model_version in self._fault_versions

    def _stream_reply(
        self, request: pb.ModelInferRequest, arrived: float
    ) -> pb.ModelStreamInferResponse:
        """The reply to one streamed request, and a span for each traced row's caller."""
        reply = self._reply(request, arrived)
        if TRACEPARENTS in request.parameters and telemetry.enabled():
            code = _reply_code(reply)
            for parent in request.parameters[TRACEPARENTS].string_param.split(","):
                telemetry.record_stream_server_span(_STREAM_METHOD, parent, arrived, code)
        return reply

    def _reply(self, request: pb.ModelInferRequest, arrived: float) -> pb.ModelStreamInferResponse:
        """The reply to one streamed request: its response, or why it failed."""
        try:
            timeout_us = _timeout_us(request)
            if timeout_us and time.monotonic() - arrived > timeout_us / 1e6:
                raise DeadlineExceeded(f"request {shown(request.id)} waited past its timeout")
            model = self._infer_model(request)
            return pb.ModelStreamInferResponse(infer_response=_infer(model, request))
        except FraudmeshError as error:
            return pb.ModelStreamInferResponse(
                error_message=f"{error.code}: {error.message}",
                infer_response=pb.ModelInferResponse(
                    model_name=request.model_name,
                    model_version=request.model_version,
                    id=request.id,
                ),
            )
        except Exception:
            # A bug, not the caller's fault: logged whole, the caller told nothing internal.
            log.exception("unhandled error", extra={"method": "ModelStreamInfer"})
            return pb.ModelStreamInferResponse(
                error_message="INTERNAL: internal error",
                infer_response=pb.ModelInferResponse(id=request.id),
            )

    def _infer_model(self, request: pb.ModelInferRequest) -> OnnxModel:
        return self._model(
            request.model_name, request.model_version, ("model_name", "model_version")
        )

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        _check_repository(request.repository_name)
        registry = self._registry()
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                entry(name=registry.name, version=e.version, state=e.state, reason=e.reason)
                for e in registry.index(ready_only=request.ready)
            ]
        )

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        _check_repository(request.repository_name)
        versions = _versions(request.parameters)
        registry = self._registry()
        _check_name(registry, request.model_name)
        # The lifecycle first: a version it routes to is then managed by it, not pinned.
        await registry.refresh(force=True)
        for version in versions:
            await registry.load(version, explicit=True)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        _check_repository(request.repository_name)
        versions = _versions(request.parameters)
        registry = self._registry()
        _check_name(registry, request.model_name)
        await registry.refresh(force=True)
        if not versions:
            registry.unload_idle()
        for version in versions:
            registry.unload(version)
        return pb.RepositoryModelUnloadResponse()


def _infer(model: OnnxModel, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """Runs ``model`` on the request's input; raises InvalidArgument for bad input."""
    batch = _input_batch(request, model)
    wanted = [o.name for o in request.outputs] or None
    known = {o.name: o for o in model.outputs}
    for index, name in enumerate(wanted or ()):
        if name not in known:
            raise InvalidArgument(f"outputs[{index}].name", f"unknown output {shown(name)}")
    # One row in ONNX Runtime costs less than a hop to a thread (docs/performance.md).
    results = model.run(batch, wanted)
    specs = [known[n] for n in wanted] if wanted else model.outputs
    response = pb.ModelInferResponse(
        model_name=model.name, model_version=model.version, id=request.id
    )
    raw = bool(request.raw_input_contents)
    for spec, array in zip(specs, results, strict=True):
        out = response.outputs.add(name=spec.name, datatype=spec.datatype, shape=array.shape)
        if raw:
            response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
        else:
            getattr(out.contents, _CONTENTS_FIELD[spec.datatype]).extend(array.ravel().tolist())
    return response


def _timeout_us(request: pb.ModelInferRequest) -> int:
    """The request's own deadline (Triton's ``timeout`` parameter, µs), 0 when none."""
    if "timeout" not in request.parameters:
        return 0
    value = request.parameters["timeout"]
    if value.WhichOneof("parameter_choice") != "int64_param" or value.int64_param < 0:
        raise InvalidArgument("parameters[timeout]", "expected a non-negative int64 (µs)")
    return value.int64_param


def _check_model_id(name: str, version: str, fields: tuple[str, str]) -> None:
    """Raises InvalidArgument when the name, or a version given, is not plain."""
    repository.check_name(fields[0], name)
    if version:
        repository.check_version(fields[1], version)


def _check_repository(name: str) -> None:
    """This server has one repository, named by nothing: ``repository_name`` stays empty."""
    if not name:
        return
    repository.check_name("repository_name", name)
    raise NotFound(
        f"repository {shown(name)} is not on this server: it serves one repository; "
        "leave repository_name empty"
    )


def _check_name(registry: ModelRegistry, name: str) -> None:
    repository.check_name("model_name", name)
    if name != registry.name:
        raise NotFound(f"model {shown(name)} is not in this repository (serving {registry.name!r})")


_PARAMETERS = ("version", "config")
"""The load and unload parameters this server reads; Triton's ``file:`` overrides (model
files sent inline) are not supported, and are refused rather than ignored."""


def _versions(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> list[str]:
    """The versions a load or unload request names: ``version``, or the specific versions
    of a ``config`` JSON (Triton's version policy); empty when it names none. Each one is
    a plain version number, or the request is InvalidArgument naming where it came from."""
    for key in parameters:
        if key not in _PARAMETERS:
            raise InvalidArgument(
                f"parameters[{shown(key)}]", "unknown parameter; this server reads version, config"
            )
    if "version" in parameters:
        field = "parameters[version]"
        value = parameters["version"]
        kind = value.WhichOneof("parameter_choice")
        if kind == "string_param":
            version = value.string_param
        elif kind == "int64_param":
            version = str(value.int64_param)
        else:
            raise InvalidArgument(field, "expected a version string or integer")
        repository.check_version(field, version)
        return [version]
    if "config" in parameters:
        return _config_versions(parameters["config"])
    return []


def _config_versions(value: pb.ModelRepositoryParameter) -> list[str]:
    """The ``version_policy.specific.versions`` of a ``config`` parameter's JSON."""
    field = "parameters[config]"
    kind = value.WhichOneof("parameter_choice")
    try:
        if kind == "string_param":
            text = value.string_param
        elif kind == "bytes_param":
            text = value.bytes_param.decode("utf-8")
        else:
            raise InvalidArgument(field, "expected a JSON model configuration (string or bytes)")
        config = json.loads(text)
    except (ValueError, RecursionError) as error:
        # RecursionError: nesting deeper than the parser's stack, a JSON bomb of brackets.
        raise InvalidArgument(field, "expected a JSON model configuration") from error
    path = f"{field}.version_policy.specific.versions"
    policy = config.get("version_policy", {}) if isinstance(config, dict) else None
    specific = policy.get("specific", {}) if isinstance(policy, dict) else None
    versions = specific.get("versions", []) if isinstance(specific, dict) else None
    if not isinstance(versions, list):
        raise InvalidArgument(path, "expected a JSON object holding a list of version numbers")
    found = []
    for index, item in enumerate(versions):
        # JSON booleans are Python ints: they are not versions.
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise InvalidArgument(f"{path}[{index}]", "expected a version number")
        version = str(item)
        repository.check_version(f"{path}[{index}]", version)
        found.append(version)
    return found


def _input_batch(request: pb.ModelInferRequest, model: OnnxModel) -> np.ndarray:
    """Decodes the one input tensor into a float32 [n, n_features] array, or says why not."""
    if len(request.inputs) != 1:
        raise InvalidArgument(
            "inputs", f"expected exactly 1 input tensor, got {len(request.inputs)}"
        )
    tensor = request.inputs[0]
    dtype = _NUMPY.get(tensor.datatype)
    if dtype is None:
        raise InvalidArgument(
            "inputs[0].datatype", f"unsupported datatype {shown(tensor.datatype)}; use FP32"
        )
    shape = tuple(tensor.shape)
    if len(shape) != 2 or shape[1] != model.n_features or shape[0] < 1:
        raise InvalidArgument(
            "inputs[0].shape", f"expected [n, {model.n_features}] with n >= 1, got {list(shape)}"
        )
    count = shape[0] * shape[1]
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InvalidArgument("raw_input_contents", "expected one entry per input tensor")
        raw = request.raw_input_contents[0]
        if len(raw) != count * np.dtype(dtype).itemsize:
            raise InvalidArgument(
                "raw_input_contents[0]",
                f"{len(raw)} bytes do not hold {count} {tensor.datatype} values",
            )
        flat = np.frombuffer(raw, dtype=dtype)
    else:
        values = getattr(tensor.contents, _CONTENTS_FIELD[tensor.datatype])
        if len(values) != count:
            raise InvalidArgument(
                "inputs[0].contents", f"{len(values)} values do not fill shape {list(shape)}"
            )
        flat = np.asarray(values, dtype=dtype)
    batch = flat.reshape(shape)
    if not np.isfinite(batch).all():
        raise InvalidArgument("inputs[0]", "contains NaN or infinity")
    return batch.astype(np.float32, copy=False)
