"""The server runtime every service shares: health, reflection, metrics, tracing, ordered
shutdown.

A service implements the small ``Service`` contract (register servicers, load and warm
up, close); ``serve`` does the rest the same way for all three services.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from services.common import logs, reflection, rpc_observer, streaming, telemetry
from services.common.interceptor import ErrorInterceptor
from services.common.settings import ServerSettings

log = logging.getLogger(__name__)

# Options every server gets: keepalive that tolerates the pings Envoy and the gateway's
# channels send. Message size limits come from each service's settings (server_options).
SERVER_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
)

CONNECTION_AGE_GRACE_MS = 10_000
"""With ``max_connection_age_s``: how long calls in flight on a closed connection may finish."""


def server_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """SERVER_OPTIONS plus the service's size limits and connection age: a larger request is answered
    RESOURCE_EXHAUSTED by grpcio before it is decoded. grpcio's metadata limit is soft below
    the absolute one (random refusals in between): both are set to the same bound."""
    options = [
        *SERVER_OPTIONS,
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        ("grpc.max_send_message_length", settings.max_response_bytes),
        ("grpc.max_metadata_size", settings.max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", settings.max_metadata_bytes),
    ]
    if settings.max_connection_age_s is not None:
        # Clients re-resolve when a connection ends, so they find replicas added since.
        options += [
            ("grpc.max_connection_age_ms", round(settings.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", CONNECTION_AGE_GRACE_MS),
        ]
    return options


class Service(Protocol):
    """What a service gives the runtime."""

    name: str

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the servicers to ``server``; returns their full service names."""
        ...

    async def start(self) -> None:
        """Loads and warms up everything needed to answer; runs before SERVING."""
        ...

    async def close(self) -> None:
        """Releases channels, stores and sessions after the server stopped."""
        ...


class Readiness(Protocol):
    """A service whose readiness changes while it runs (a consumer that loses its backend or
    falls behind): the runtime follows ``ready()`` after ``start`` instead of SERVING at once."""

    def ready(self) -> bool:
        """True while the service does its job."""
        ...


STREAM_END_INTERVAL_S = 0.05
"""How often a stopping server ends the streams still open, until it has stopped."""
READINESS_INTERVAL_S = 0.25
"""How often the runtime asks a ``Readiness`` service whether it is ready."""


class HealthServicer(health.aio.HealthServicer):
    """grpcio's asyncio health servicer, with ``List`` answered on the event loop.

    The stock class inherits a synchronous ``List`` that says UNIMPLEMENTED; an asyncio server
    runs such a handler on a thread, and one call of it left ``server.stop`` waiting for that
    thread. Here ``List`` is a coroutine that answers every status the servicer holds."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthListResponse:
        """Every service's status, as Check would answer it."""
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._server_status.items()
            }
        )


class Runtime:
    """One running server: its health servicer, bound port and shutdown event."""

    def __init__(self, settings: ServerSettings, service: Service) -> None:
        self.settings = settings
        self.service = service
        self.health = HealthServicer()
        # Outermost first: the observer sees the status the error interceptor settles on.
        observer = [rpc_observer.RpcObserver()] if settings.observe_rpcs else []
        self.server = grpc.aio.server(
            interceptors=[*observer, ErrorInterceptor()],
            options=server_options(settings),
        )
        self.port = 0
        self.stopping = asyncio.Event()
        self.undrained = asyncio.Event()
        """Set when nothing routes calls here any more (SIGINT): the drain is cut short."""
        self._names: list[str] = []
        self._follower: asyncio.Task[None] | None = None
        self._loop_lag: asyncio.Task[None] | None = None
        self._gc_pauses: rpc_observer.GcPauses | None = None

    async def _set_all(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        for name in ["", *self._names]:
            await self.health.set(name, status)

    async def start(self) -> None:
        """Binds and starts the server as NOT_SERVING, warms the service, then SERVING."""
        self._names = self.service.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable([*self._names, health.SERVICE_NAME], self.server)
        # grpcio's HealthServicer says SERVING for "" from the start: say otherwise until ready.
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.settings.host}:{self.settings.port}"
        self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"cannot bind {address}")
        await self.server.start()
        if self.settings.observe_rpcs:
            self._gc_pauses = rpc_observer.GcPauses()
            self._loop_lag = asyncio.create_task(
                rpc_observer.watch_loop_lag(gc_pauses=self._gc_pauses)
            )
        log.info("listening", extra={"port": self.port, "phase": "warming"})
        await self.service.start()
        # Objects alive after warm-up live for the whole process: keep them out of the
        # collector's generations so full collections stay short on the request path.
        gc.collect()
        gc.freeze()
        if self._gc_pauses is not None:
            # Collections from here on are the ones a request can meet: time them.
            self._gc_pauses.install()
        ready = getattr(self.service, "ready", None)
        if callable(ready):
            self._follower = asyncio.create_task(self._follow(ready))
            return
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"port": self.port, "service": self.service.name})

    async def _follow(self, ready: Callable[[], bool]) -> None:
        """Keeps the health status equal to the service's readiness until shutdown."""
        serving = False
        while True:
            now = bool(ready())
            if now != serving:
                serving = now
                status = health_pb2.HealthCheckResponse
                await self._set_all(status.SERVING if now else status.NOT_SERVING)
                log.info(
                    "serving" if now else "not ready",
                    extra={"port": self.port, "service": self.service.name},
                )
            await asyncio.sleep(READINESS_INTERVAL_S)

    def stop_undrained(self) -> None:
        """Stops without (the rest of) the drain: nothing routes calls here any more."""
        self.undrained.set()
        self.stopping.set()

    async def stop(self) -> None:
        """Ordered shutdown: NOT_SERVING, let health checks notice, drain, stop, close."""
        for task in (self._follower, self._loop_lag):
            if task is not None:
                task.cancel()
        if self._gc_pauses is not None:
            self._gc_pauses.uninstall()
        await self.health.enter_graceful_shutdown()
        if not self.undrained.is_set():
            log.info("draining", extra={"drain_seconds": self.settings.drain_seconds})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.undrained.wait(), self.settings.drain_seconds)
                log.info("drain cut short: nothing routes calls here any more")
        await self._stop_server()
        await self.service.close()
        telemetry.shutdown()
        log.info("stopped")

    async def _stop_server(self) -> None:
        """Refuses new calls and gives those in flight ``grace_seconds``, but ends the
        long-lived streams at once (``streaming.end_open_streams``): a stream the gateway
        keeps open would otherwise hold the process for the whole grace period. Streams are
        ended until the server has stopped, so none opened meanwhile outlasts it."""
        stopped = asyncio.ensure_future(self.server.stop(self.settings.grace_seconds))
        await asyncio.sleep(0)  # the stop begins: new calls are refused from here on
        ended = 0
        while not stopped.done():
            ended += streaming.end_open_streams()
            await asyncio.wait({stopped}, timeout=STREAM_END_INTERVAL_S)
        await stopped
        if ended:
            log.info("open streams ended", extra={"streams": ended})


async def _run(settings: ServerSettings, service: Service) -> None:
    runtime = Runtime(settings, service)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, runtime.stopping.set)
    loop.add_signal_handler(signal.SIGINT, runtime.stop_undrained)
    await runtime.start()
    await runtime.stopping.wait()
    await runtime.stop()


def trace_plan(name: str, settings: ServerSettings) -> telemetry.TracePlan:
    """The service's trace plan: the standard OTEL_* variables over its settings."""
    return telemetry.plan(
        name, settings.tracing, settings.trace_sample_ratio, telemetry.OtelEnvironment()
    )


def serve(settings: ServerSettings, service: Service) -> None:
    """Runs ``service`` until SIGTERM or SIGINT, then shuts it down in order: SIGTERM first
    drains (NOT_SERVING for ``drain_seconds``, so that routers go elsewhere); SIGINT, at once
    or during that drain, says nothing routes here any more and cuts it short. Calls in
    flight get ``grace_seconds`` either way."""
    logs.configure(service.name, settings.log_level, settings.log_json)
    telemetry.configure(trace_plan(service.name, settings))
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.host)
    asyncio.run(_run(settings, service))
