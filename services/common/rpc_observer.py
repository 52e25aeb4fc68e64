"""What every gRPC server observes of itself: each call's latency (a histogram with the
trace id as exemplar), its span (``telemetry``), garbage-collection pauses by generation and
the event loop's lag.

``RpcObserver`` is the outermost server interceptor of the shared runtime, so it sees the
status the error interceptor inside it settled on. A streamed method's call lasts as long as
its stream: its latency is observed per request message instead (``observe_message``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import trace
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from services.common import metric_catalogue as catalogue
from services.common import telemetry

LOOP_LAG_INTERVAL_S = 0.1
"""How often the loop-lag probe wakes: ten cheap wake-ups a second."""


class ServerMetrics:
    """The shared runtime's metric families (declared in the catalogue)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.rpc_duration = catalogue.RPC_SERVER_DURATION.create(registry)
        self.gc_pause = catalogue.GC_PAUSE.create(registry)
        self.loop_lag = catalogue.EVENT_LOOP_LAG.create(registry)


_metrics: ServerMetrics | None = None


def server_metrics() -> ServerMetrics:
    """This process's runtime metrics, created on first use."""
    global _metrics
    if _metrics is None:
        _metrics = ServerMetrics()
    return _metrics


def _observe(histogram: Any, seconds: float) -> None:
    """Observes with the current trace id as exemplar when the call is traced."""
    trace_id = telemetry.trace_id()
    if trace_id is None:
        histogram.observe(seconds)
    else:
        histogram.observe(seconds, exemplar={"trace_id": trace_id})


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def observe_message(method: str) -> Callable[[float, int], None]:
    """A recorder of one streamed method's per-message latency: (seconds since the request
    message arrived, the reply's status code number)."""
    service, name = telemetry.split_method(method)
    histogram = server_metrics().rpc_duration
    children: dict[int, Histogram] = {}

    def record(seconds: float, code: int) -> None:
        child = children.get(code)
        if child is None:
            status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            child = children[code] = histogram.labels(service, name, status.name)
        child.observe(seconds)

    return record


def _code_of(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if error is None:
        return grpc.StatusCode.OK
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


class RpcObserver(grpc.aio.ServerInterceptor):
    """Times every call and, with tracing on, wraps it in a SERVER span."""

    def __init__(self, metrics: ServerMetrics | None = None) -> None:
        self._metrics = metrics or server_metrics()
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if method not in self._wrapped:
            self._wrapped[method] = self._wrap(handler, method)
        wrapped = self._wrapped[method]
        if wrapped is None or not telemetry.enabled():
            return wrapped or handler
        return self._traced(wrapped, method, handler_call_details.invocation_metadata)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler | None:
        """The handler with its latency observed; None for streamed requests (their calls
        are streams; the servicer observes each message) and synchronous behaviours."""
        behavior = handler.unary_unary or handler.unary_stream
        if behavior is None or not (
            inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)
        ):
            return None
        service, name = telemetry.split_method(method)
        family = self._metrics.rpc_duration
        children: dict[grpc.StatusCode, Any] = {}

        def record(started: float, context: Any, error: BaseException | None) -> None:
            code = _code_of(context, error)
            child = children.get(code)
            if child is None:
                child = children[code] = family.labels(service, name, code.name)
            _observe(child, time.perf_counter() - started)
            telemetry.end_server_span(trace.get_current_span(), code)

        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    response = await unary(request, context)
                except BaseException as error:
                    record(started, context, error)
                    raise
                record(started, context, None)
                return response

            return grpc.unary_unary_rpc_method_handler(
                timed,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        streamed = handler.unary_stream

        async def timed_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for response in _responses(streamed, request, context):
                    yield response
            except BaseException as error:
                record(started, context, error)
                raise
            record(started, context, None)

        return grpc.unary_stream_rpc_method_handler(
            timed_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    @staticmethod
    def _traced(
        handler: grpc.RpcMethodHandler, method: str, metadata: Any
    ) -> grpc.RpcMethodHandler:
        """The timed handler run inside a SERVER span (the timing records its status)."""
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def in_span(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with telemetry.start_server_span(method, metadata):
                    return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                in_span,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        streamed = handler.unary_stream

        async def in_span_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            with telemetry.start_server_span(method, metadata):
                async for response in _responses(streamed, request, context):
                    yield response

        return grpc.unary_stream_rpc_method_handler(
            in_span_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def _responses(
    behavior: Callable[..., Any], request: Any, context: grpc.aio.ServicerContext
) -> AsyncIterator[Any]:
    """The responses of a server-streaming behaviour, either kind grpc.aio allows: an async
    generator yields them; a coroutine (the health service's Watch) writes them itself with
    ``context.write`` and yields none here."""
    if inspect.isasyncgenfunction(behavior):
        async for response in behavior(request, context):
            yield response
    else:
        await behavior(request, context)


class GcPauses:
    """Times each garbage collection through ``gc.callbacks``, by generation.

    The callback only notes the pause; ``flush`` observes the notes. A collection starts on
    whichever thread allocates, which may be inside a metric's ``with lock:`` (in
    prometheus_client's multiprocess mode, one lock for every value, held while the file is
    written). Observing from the callback would wait on that lock on the thread that holds it,
    for ever. Appending to a list takes no lock.
    """

    def __init__(self, metrics: ServerMetrics | None = None) -> None:
        histogram = (metrics or server_metrics()).gc_pause
        self._children = [histogram.labels(str(generation)) for generation in range(3)]
        self._pending: list[list[float]] = [[], [], []]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        """The ``gc.callbacks`` hook: notes the pause, observes nothing."""
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._pending[min(info.get("generation", 2), 2)].append(
                time.perf_counter() - self._started
            )

    def flush(self) -> None:
        """Observes the pauses noted since the last flush (call it outside a collection)."""
        for generation, child in enumerate(self._children):
            # The swap hands over the list a callback may still append to: nothing is lost.
            noted, self._pending[generation] = self._pending[generation], []
            for seconds in noted:
                child.observe(seconds)

    def install(self) -> None:
        """Starts timing collections in this process."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        """Stops timing collections and observes what was noted."""
        if self in gc.callbacks:
            gc.callbacks.remove(self)
        self.flush()


async def watch_loop_lag(
    metrics: ServerMetrics | None = None,
    interval_s: float = LOOP_LAG_INTERVAL_S,
    gc_pauses: GcPauses | None = None,
) -> None:
    """Runs until cancelled: sleeps ``interval_s``, observes how late it woke and flushes the
    garbage collections ``gc_pauses`` noted meanwhile."""
    histogram = (metrics or server_metrics()).loop_lag
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        histogram.observe(max(loop.time() - due, 0.0))
        if gc_pauses is not None:
            gc_pauses.flush()
