"""Server reflection that resolves every symbol a client asks for, methods included.

grpcio-reflection looks symbols up with ``DescriptorPool.FindFileContainingSymbol``, which
in the upb and C++ protobuf runtimes knows services, messages, fields and enums but not
methods (``fraud.v1.FraudScoring.Score``) nor enum values named inside their enum. ghz asks
for the method symbol and then fails with "Symbol not found" (grpc issue 34743, ghz issue
419). This servicer falls back to the enclosing service or enum for such names.

It also answers only for the files of the services the server exposes and their imports:
a process that imports other protos (Feast's, OpenTelemetry's) does not publish them.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import _async, _base, reflection_pb2, reflection_pb2_grpc

SERVICE_NAME = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name
"""grpc.reflection.v1alpha.ServerReflection."""


def _closure(files: Iterable[FileDescriptor]) -> frozenset[str]:
    """Names of ``files`` and every file they import, transitively."""
    seen: set[str] = set()
    stack = list(files)
    while stack:
        file = stack.pop()
        if file.name not in seen:
            seen.add(file.name)
            stack.extend(file.dependencies)
    return frozenset(seen)


class ReflectionServicer(_async.ReflectionServicer):
    """grpcio's asyncio reflection servicer with method symbols and a bounded file set."""

    def __init__(
        self, service_names: Iterable[str], pool: descriptor_pool.DescriptorPool | None = None
    ) -> None:
        names = tuple(service_names)
        super().__init__(names, pool=pool)
        self._pool = pool or descriptor_pool.Default()
        self._files = _closure(self._pool.FindServiceByName(name).file for name in names)

    def _find_file(self, symbol: str) -> FileDescriptor | None:
        """The file defining ``symbol`` (service, method, message, field, enum or value)."""
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            pass
        parent, _, leaf = symbol.rpartition(".")
        if not parent:
            return None
        try:
            service = self._pool.FindServiceByName(parent)
        except KeyError:
            service = None
        if service is not None and leaf in service.methods_by_name:
            return service.file
        try:
            enum = self._pool.FindEnumTypeByName(parent)
        except KeyError:
            return None
        return enum.file if leaf in enum.values_by_name else None

    def _file_containing_symbol(
        self, request: reflection_pb2.ServerReflectionRequest, fully_qualified_name: str
    ) -> reflection_pb2.ServerReflectionResponse:
        file = self._find_file(fully_qualified_name)
        if file is None or file.name not in self._files:
            return _not_found(request)
        return _base._file_descriptor_response(file, request)

    def _file_by_filename(
        self, request: reflection_pb2.ServerReflectionRequest, filename: str
    ) -> reflection_pb2.ServerReflectionResponse:
        if filename not in self._files:
            return _not_found(request)
        return super()._file_by_filename(request, filename)


def _not_found(
    request: reflection_pb2.ServerReflectionRequest,
) -> reflection_pb2.ServerReflectionResponse:
    return reflection_pb2.ServerReflectionResponse(
        error_response=reflection_pb2.ErrorResponse(
            error_code=grpc.StatusCode.NOT_FOUND.value[0], error_message="symbol not found"
        ),
        original_request=request,
    )


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Adds reflection for ``service_names`` (and reflection itself) to ``server``."""
    names = [*service_names, SERVICE_NAME]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(ReflectionServicer(names), server)
