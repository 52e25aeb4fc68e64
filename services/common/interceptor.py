"""The one mapping point from exceptions to gRPC statuses, as a server interceptor.

Every method of every servicer on a runtime's server passes through it, so each rule here
holds for RPCs added later without their authors doing anything:

* requests are decoded here, not by grpcio (``services.common.decoding``): bytes that are
  not a valid message, invalid UTF-8 in a string, an out-of-range Timestamp or an unknown
  enum number are INVALID_ARGUMENT naming the field, never UNKNOWN or INTERNAL. Each
  message of a streamed request is parsed here too (bytes that are not a message end the
  stream, naming the field: no id in them can be trusted); its range checks are left to
  the servicer, which answers a request that fails them on the stream and goes on;
* a call whose deadline has already passed is DEADLINE_EXCEEDED before any work;
* a ``FraudmeshError`` becomes its status, with a ``BadRequest`` detail for bad input;
  anything else is INTERNAL with a generic message and a log line;
* status messages and details are capped, so no client value can grow a status header
  beyond HTTP/2 limits.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.decoding import RequestDecoder
from services.common.errors import FraudmeshError, InvalidArgument

log = logging.getLogger(__name__)

MAX_STATUS_MESSAGE = 512
"""Longest status message or violation description sent; longer ones are cut."""

_Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


def _capped(text: str) -> str:
    if len(text) <= MAX_STATUS_MESSAGE:
        return text
    return text[: MAX_STATUS_MESSAGE - 1] + "…"


def _status_for(error: FraudmeshError) -> grpc.Status:
    """Builds the rich status: code, message and, for bad input, a BadRequest detail."""
    status = status_pb2.Status(code=getattr(code_pb2, error.code), message=_capped(error.message))
    if isinstance(error, InvalidArgument):
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=_capped(error.field), description=_capped(error.description)
                    )
                ]
            )
        )
        status.details.append(detail)
    return rpc_status.to_status(status)


async def _abort_for(error: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    """Aborts the call with the status ``error`` stands for; never returns."""
    if isinstance(error, FraudmeshError):
        await context.abort_with_status(_status_for(error))
    if isinstance(error, DecodeError | UnicodeDecodeError):
        # A streamed request message grpcio could not decode.
        await context.abort_with_status(
            _status_for(InvalidArgument("request", "is not a valid message of this method"))
        )
    code = context.code()
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        # The servicer set its status before raising, as generated stubs of methods it does
        # not implement do (UNIMPLEMENTED, then NotImplementedError): keep that status.
        await context.abort(code, _capped(str(context.details() or "")))
    # Unknown failures are bugs: log them whole, tell the client nothing internal.
    log.error("unhandled error", exc_info=error, extra={"method": method})
    await context.abort(grpc.StatusCode.INTERNAL, "internal error")


def _expired(context: grpc.aio.ServicerContext) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


async def _abort_expired(context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before the call began")


def _unary_request(
    behavior: _Behavior, method: str, decode: RequestDecoder | None
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Wraps a unary-request, unary-response behavior: decode, check, run, map errors."""

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if _expired(context):
            await _abort_expired(context)
        try:
            message = decode(request) if decode is not None else request
            return await behavior(message, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _abort_for(error, context, method)

    return handler


def _unary_request_stream(
    behavior: _Behavior, method: str, decode: RequestDecoder | None
) -> _Behavior:
    """Wraps a unary-request, streamed-response behavior of either aio style."""
    if inspect.isasyncgenfunction(behavior):

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if _expired(context):
                await _abort_expired(context)
            try:
                message = decode(request) if decode is not None else request
                async for response in behavior(message, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await _abort_for(error, context, method)

        return generator
    return _unary_request(behavior, method, decode)


async def _decoded(requests: AsyncIterator[bytes], decode: RequestDecoder) -> AsyncIterator[Any]:
    async for data in requests:
        yield decode(data)


def _streamed_request(behavior: _Behavior, method: str, decode: RequestDecoder | None) -> _Behavior:
    """Wraps a streamed-request behavior: each message parsed (``decode``, else by grpcio),
    errors mapped."""

    def incoming(requests: Any) -> Any:
        return requests if decode is None else _decoded(requests, decode)

    if inspect.isasyncgenfunction(behavior):

        async def generator(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for response in behavior(incoming(requests), context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                await _abort_for(error, context, method)

        return generator

    async def handler(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(incoming(requests), context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _abort_for(error, context, method)

    return handler


def wrap_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """The handler with the runtime's decoding and error mapping around its behavior."""
    behavior = _behavior_of(handler)
    if handler.unary_unary is not None and not inspect.iscoroutinefunction(behavior):
        # A synchronous unary behavior (an unimplemented method of a generated base class,
        # say): the aio server would call it inline on the loop; so does the wrapper.
        sync = handler.unary_unary

        async def run_inline(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return sync(request, context)

        handler = grpc.unary_unary_rpc_method_handler(
            run_inline,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    elif not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        # A synchronous streaming behavior: left as grpcio serves it.
        return handler
    if handler.unary_unary is not None or handler.unary_stream is not None:
        decode = RequestDecoder.for_deserializer(handler.request_deserializer)
        # With our decoder, grpcio hands over the raw bytes (no deserializer).
        deserializer = None if decode is not None else handler.request_deserializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary_request(handler.unary_unary, method, decode),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.unary_stream_rpc_method_handler(
            _unary_request_stream(handler.unary_stream, method, decode),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    parse = RequestDecoder.for_deserializer(handler.request_deserializer, checked=False)
    deserializer = None if parse is not None else handler.request_deserializer
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _streamed_request(handler.stream_unary, method, parse),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.stream_stream_rpc_method_handler(
        _streamed_request(handler.stream_stream, method, parse),
        request_deserializer=deserializer,
        response_serializer=handler.response_serializer,
    )


def _behavior_of(handler: grpc.RpcMethodHandler) -> Any:
    return (
        handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    )


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Decodes requests itself and maps every failure to a clear status (see the module)."""

    def __init__(self) -> None:
        # Wrapped handlers are built once per method, not once per call.
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if method in self._wrapped:
            return self._wrapped[method]
        handler = await continuation(handler_call_details)
        if handler is None:
            # Unknown method: grpcio answers UNIMPLEMENTED; do not remember client paths.
            return handler
        wrapped = wrap_handler(handler, method)
        self._wrapped[method] = wrapped
        return wrapped
