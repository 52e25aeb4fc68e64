"""OpenTelemetry tracing: spans for every gRPC call in and out, named and attributed by the
OpenTelemetry RPC semantic conventions (v1.37.0: ``fraud.v1.FraudScoring/Score``,
``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``), with the W3C
trace context carried in gRPC metadata, so one trace runs from Envoy through the gateway to
the feature service and the scorer.

What is exported where follows the standard SDK variables (``OTEL_TRACES_EXPORTER``,
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` and ``_PROTOCOL``, ``OTEL_TRACES_SAMPLER`` and
``_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) over the project's settings
(``FRAUD_<SERVICE>_TRACING``: off, console or otlp; ``..._TRACE_SAMPLE_RATIO``). ``plan``
resolves them without side effects (the mesh uses it to configure Envoy's sampling the same
way); ``configure`` installs the result once per process. Tracing is off unless asked for:
on the 42 ms path every span costs CPU (docs/observability.md has the figures).

The server side is ``services.common.rpc_observer`` (one interceptor for the span and the
latency histogram); the client side is ``client_interceptors``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic_settings import BaseSettings, SettingsConfigDict

SEMCONV_SCHEMA = "https://opentelemetry.io/schemas/1.37.0"
"""The semantic conventions the spans follow."""

Tracing = Literal["off", "console", "otlp"]
Exporter = Literal["none", "console", "otlp"]

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
"""The standard sampler names of ``OTEL_TRACES_SAMPLER``."""

DEFAULT_OTLP_ENDPOINT = {"grpc": "http://localhost:4317", "http/protobuf": "http://localhost:4318"}
"""The SDK's default OTLP endpoint per protocol."""

# Server span status per the conventions: only these codes mean the server failed.
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


class OtelEnvironment(BaseSettings):
    """The standard OpenTelemetry SDK variables that choose trace export (no prefix)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    otel_traces_exporter: str | None = None
    otel_exporter_otlp_endpoint: str | None = None
    otel_exporter_otlp_traces_endpoint: str | None = None
    otel_exporter_otlp_protocol: str | None = None
    otel_exporter_otlp_traces_protocol: str | None = None
    otel_traces_sampler: str | None = None
    otel_traces_sampler_arg: str | None = None
    otel_service_name: str | None = None


@dataclass(frozen=True)
class TracePlan:
    """How one process traces: where spans go and which requests are recorded."""

    exporter: Exporter
    service_name: str
    sampler: str = "parentbased_traceidratio"
    """One of ``SAMPLERS``."""
    ratio: float = 1.0
    """The share of new traces recorded by the ratio samplers."""
    endpoint: str = DEFAULT_OTLP_ENDPOINT["grpc"]
    protocol: Literal["grpc", "http/protobuf"] = "grpc"

    @property
    def enabled(self) -> bool:
        """True when spans are exported at all."""
        return self.exporter != "none"

    @property
    def root_share(self) -> float:
        """The share of requests without a parent that this plan records (what a head
        sampler in front, Envoy, should record so that its children agree)."""
        if self.sampler.endswith("always_on"):
            return 1.0
        if self.sampler.endswith("always_off"):
            return 0.0
        return self.ratio


def plan(
    service: str, tracing: Tracing, sample_ratio: float, otel: OtelEnvironment | None = None
) -> TracePlan:
    """The trace plan of ``service``: the standard variables where set, else the project's
    settings. As in the SDK, an exporter chosen by ``OTEL_TRACES_EXPORTER`` without a sampler
    records every trace (``parentbased_always_on``); the project's ``tracing`` setting
    samples ``sample_ratio`` of new traces. Raises ValueError naming a bad variable."""
    env = otel or OtelEnvironment()
    name = env.otel_service_name or f"fraudmesh-{service}"
    exporter: Exporter = "none" if tracing == "off" else tracing
    sampler, ratio = "parentbased_traceidratio", sample_ratio
    if env.otel_traces_exporter is not None:
        chosen = env.otel_traces_exporter.strip().lower()
        if chosen not in ("none", "console", "otlp"):
            raise ValueError(f"OTEL_TRACES_EXPORTER must be otlp, console or none, got {chosen!r}")
        exporter = chosen  # type: ignore[assignment]
        sampler, ratio = "parentbased_always_on", 1.0
    if env.otel_traces_sampler is not None:
        sampler = env.otel_traces_sampler.strip().lower()
        if sampler not in SAMPLERS:
            raise ValueError(f"OTEL_TRACES_SAMPLER must be one of {', '.join(SAMPLERS)}")
        ratio = 1.0
        if sampler.endswith("traceidratio") and env.otel_traces_sampler_arg is not None:
            try:
                ratio = float(env.otel_traces_sampler_arg)
            except ValueError:
                raise ValueError("OTEL_TRACES_SAMPLER_ARG must be a number in 0..1") from None
            if not 0 <= ratio <= 1:
                raise ValueError("OTEL_TRACES_SAMPLER_ARG must be a number in 0..1")
    protocol = (
        env.otel_exporter_otlp_traces_protocol or env.otel_exporter_otlp_protocol or "grpc"
    ).strip()
    if protocol not in DEFAULT_OTLP_ENDPOINT:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, got {protocol!r}"
        )
    endpoint = env.otel_exporter_otlp_traces_endpoint
    if endpoint is None and env.otel_exporter_otlp_endpoint is not None:
        base = env.otel_exporter_otlp_endpoint.rstrip("/")
        # The per-signal path is added to the shared endpoint for HTTP only (SDK rule).
        endpoint = f"{base}/v1/traces" if protocol == "http/protobuf" else base
    if endpoint is None:
        default = DEFAULT_OTLP_ENDPOINT[protocol]
        endpoint = f"{default}/v1/traces" if protocol == "http/protobuf" else default
    return TracePlan(
        exporter=exporter,
        service_name=name,
        sampler=sampler,
        ratio=ratio,
        endpoint=endpoint,
        protocol=protocol,  # type: ignore[arg-type]
    )


def sampler_of(plan_: TracePlan) -> Sampler:
    """The SDK sampler a plan names."""
    base: Sampler
    if plan_.sampler.endswith("always_on"):
        base = ALWAYS_ON
    elif plan_.sampler.endswith("always_off"):
        base = ALWAYS_OFF
    else:
        base = TraceIdRatioBased(plan_.ratio)
    return ParentBased(base) if plan_.sampler.startswith("parentbased") else base


def _exporter_of(plan_: TracePlan) -> SpanExporter:
    if plan_.exporter == "console":
        return ConsoleSpanExporter(
            out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
    if plan_.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(endpoint=plan_.endpoint, timeout=5)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # A collector that is down costs a failed export in the exporter's thread, never a call.
    return OTLPSpanExporter(
        endpoint=plan_.endpoint, insecure=plan_.endpoint.startswith("http://"), timeout=5
    )


_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None


def configure(plan_: TracePlan) -> None:
    """Installs the tracer provider for this process (once, before any channel or server)."""
    global _provider, _tracer
    if not plan_.enabled or _provider is not None:
        return
    provider = TracerProvider(
        # OTEL_RESOURCE_ATTRIBUTES joins these (the SDK reads it); the name set here wins.
        resource=Resource.create({"service.name": plan_.service_name}),
        sampler=sampler_of(plan_),
    )
    provider.add_span_processor(BatchSpanProcessor(_exporter_of(plan_), schedule_delay_millis=1000))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("fraudmesh", schema_url=SEMCONV_SCHEMA)


def enabled() -> bool:
    """True when tracing was configured in this process."""
    return _provider is not None


def tracer() -> trace.Tracer:
    """The process's tracer (a no-op one when tracing is off)."""
    return _tracer or trace.get_tracer("fraudmesh", schema_url=SEMCONV_SCHEMA)


def sampled() -> bool:
    """True when the current request is traced (its span is sampled)."""
    return enabled() and trace.get_current_span().get_span_context().trace_flags.sampled


def trace_id() -> str | None:
    """The current sampled span's trace id in hex (for exemplars), else None."""
    if _provider is None:
        return None
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.trace_flags.sampled else None


def annotate(attributes: Mapping[str, str | int | float | bool]) -> None:
    """Adds the project's attributes (``fraudmesh.*``) to the current span, if recorded."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def split_method(method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` → (``pkg.Service``, ``Method``)."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def rpc_attributes(method: str) -> dict[str, str]:
    """The conventions' attributes of one gRPC method."""
    service, name = split_method(method)
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def start_server_span(method: str, metadata: Sequence[tuple[str, Any]] | None) -> Any:
    """A SERVER span for an incoming call, child of the caller's context in ``metadata``;
    a context manager that makes it current."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    parent = propagate.extract(carrier)
    return tracer().start_as_current_span(
        method.lstrip("/"),
        context=parent,
        kind=SpanKind.SERVER,
        attributes=rpc_attributes(method),
        record_exception=False,
        set_status_on_exception=False,
    )


def end_server_span(span: trace.Span, code: grpc.StatusCode) -> None:
    """Records the call's status on its SERVER span."""
    if span.is_recording():
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code in _SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code.name))


class _ClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Opens a CLIENT span per unary call and sends the trace context in its metadata."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._peer: dict[str, str | int] = {"server.address": host or target}
        if port.isdigit():
            self._peer["server.port"] = int(port)

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        if not trace.get_current_span().get_span_context().trace_flags.sampled:
            # Nothing recorded upstream: no span here either, and no context to pass on.
            return await continuation(client_call_details, request)
        with tracer().start_as_current_span(
            method.lstrip("/"),
            kind=SpanKind.CLIENT,
            attributes={**rpc_attributes(method), **self._peer},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier, context=otel_context.get_current())
            metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
            for key, value in carrier.items():
                metadata.add(key, value)
            details = grpc.aio.ClientCallDetails(
                client_call_details.method,
                client_call_details.timeout,
                metadata,
                client_call_details.credentials,
                client_call_details.wait_for_ready,
            )
            call = await continuation(details, request)
            code = await call.code()
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code is not grpc.StatusCode.OK:
                # Client spans: every status but OK is an error (the conventions).
                span.set_status(Status(StatusCode.ERROR, code.name))
            return call


def traceparent() -> str:
    """The W3C ``traceparent`` of the current span, to carry inside a stream message."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def start_stream_client_span(method: str) -> Any:
    """A CLIENT span for one request sent on a persistent stream (a context manager that
    makes it current, so ``traceparent`` names it)."""
    return tracer().start_as_current_span(
        method.lstrip("/"),
        kind=SpanKind.CLIENT,
        attributes=rpc_attributes(method),
        record_exception=False,
        set_status_on_exception=False,
    )


def mark_error(span: trace.Span, reason: str) -> None:
    """Marks ``span`` failed (a call that ended without its answer)."""
    span.set_status(Status(StatusCode.ERROR, reason))


def record_stream_server_span(method: str, parent: str, arrived: float, code: int) -> None:
    """Records the SERVER span of one request message answered on a persistent stream: from
    ``arrived`` (monotonic clock) to now, a child of its caller's ``parent`` traceparent."""
    if _provider is None or not parent:
        return
    now_ns = time.time_ns()
    started_ns = now_ns - int((time.monotonic() - arrived) * 1e9)
    span = tracer().start_span(
        method.lstrip("/"),
        context=propagate.extract({"traceparent": parent}),
        kind=SpanKind.SERVER,
        attributes={**rpc_attributes(method), "rpc.grpc.status_code": code},
        start_time=started_ns,
    )
    status = _STATUS_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    if status in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, status.name))
    span.end(end_time=now_ns)


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def client_interceptors(target: str) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors that open a span per outgoing unary call (none when tracing is off)."""
    return [_ClientInterceptor(target)] if enabled() else []


def shutdown() -> None:
    """Flushes pending spans; part of the ordered shutdown."""
    if _provider is not None:
        _provider.shutdown()
