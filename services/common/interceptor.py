"""The one mapping point from exceptions to gRPC statuses, as a server interceptor."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.errors import FraudmeshError, InvalidArgument

log = logging.getLogger(__name__)

_Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _status_for(error: FraudmeshError) -> grpc.Status:
    """Builds the rich status: code, message and, for bad input, a BadRequest detail."""
    status = status_pb2.Status(code=getattr(code_pb2, error.code), message=error.message)
    if isinstance(error, InvalidArgument):
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=error.field, description=error.description
                    )
                ]
            )
        )
        status.details.append(detail)
    return rpc_status.to_status(status)


def _wrap(behavior: _Behavior, method: str) -> _Behavior:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except FraudmeshError as error:
            await context.abort_with_status(_status_for(error))
        except grpc.aio.AbortError:
            raise
        except Exception:
            # Unknown failures are bugs: log them whole, tell the client nothing internal.
            log.exception("unhandled error", extra={"method": method})
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Aborts with the status a FraudmeshError carries; anything else becomes INTERNAL."""

    def __init__(self) -> None:
        # Wrapped handlers are built once per method, not once per call.
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            _wrap(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped
