"""Client channels to other services, with the options every hop should use."""

from __future__ import annotations

import grpc

from services.common import telemetry

CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    # Keep the HTTP/2 connection warm so no request pays for a reconnect.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a dependency restarts: the breaker, not backoff, protects it.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.enable_retries", 0),
    # A name with several addresses (a Kubernetes headless Service in front of replicas)
    # gets every call spread over all of them; pick_first would pin the channel to one.
    # One address behaves as before.
    ("grpc.lb_policy_name", "round_robin"),
)


def insecure_channel(target: str, traced: bool = True) -> grpc.aio.Channel:
    """An aio channel to ``target`` (host:port) on a trusted network; with ``traced`` (and
    tracing on) every call on it opens a span and carries the trace context. Persistent
    streams use an untraced channel: a stream carries many requests, of many traces."""
    interceptors = telemetry.client_interceptors(target) if traced else []
    return grpc.aio.insecure_channel(
        target, options=CHANNEL_OPTIONS, interceptors=interceptors or None
    )
