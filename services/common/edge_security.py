"""Edge hardening: request size limits, TLS or mutual TLS, JWT authentication and per-client
rate limits, added to the Envoy bootstrap that ``services.common.envoy.render_config`` renders.

The bootstrap template describes routing, timeouts and resilience; this module adds what
depends on how the edge is deployed, by parsing the rendered YAML, adding the pieces and
dumping it again (``apply``). It finds its way in the template by names: the listener
``grpc_edge``, its connection manager's routes ``reflection_v1``, ``reflection_v1alpha``,
``health`` and ``grpc``, the cluster ``gateway`` and the first filter, the edge's local rate
limit. ``tests/unit/test_edge_security.py`` renders the template and checks every addition.
What ``apply`` adds, and why: ``docs/security.md``, "What the edge adds".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LISTENER = "grpc_edge"
"""Name of the template's public listener."""

CLUSTER = "gateway"
"""Name of the template's gateway cluster."""

TOOLING_ROUTES = ("reflection_v1", "reflection_v1alpha", "health")
"""Routes of tooling calls: reflection (a bidirectional stream) and health."""

HEALTH_PREFIX = "/grpc.health.v1.Health/"
"""Path prefix of the health API, open to probes without a token."""

PROVIDER = "fraudmesh"
"""Name of the JWT provider in Envoy's jwt_authn configuration."""

JWT_METADATA = "jwt_payload"
"""Dynamic-metadata key under which jwt_authn stores a verified token's payload."""

GRPC_RESOURCE_EXHAUSTED = 8
"""gRPC status code of an oversized request (Envoy would otherwise map 413 to UNKNOWN)."""

PUSHBACK_HEADER = "grpc-retry-pushback-ms"
"""Trailing metadata of a refusal at the edge's limit: how long the client should wait."""

DEV_FILES = {
    "ca": "ca.pem",
    "cert": "server.pem",
    "key": "server-key.pem",
    "client_cert": "client.pem",
    "client_key": "client-key.pem",
    "jwt_key": "jwt-key.pem",
    "jwks": "jwks.json",
}
"""File names under ``<var>/tls/`` that ``fraudmesh certs`` writes."""

_TYPES = {
    "buffer": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
    "buffer_route": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
    "jwt": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
    "ratelimit": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
    "tls": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
    "hcm": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "router": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
}


class EdgeSettings(BaseSettings):
    """How the edge is secured (env prefix ``FRAUD_EDGE_``); paths default to ``<var>/tls/``."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_EDGE_", extra="ignore", frozen=True)

    tls: bool = Field(False, description="Serve the public listener over TLS only.")
    mtls: bool = Field(
        False,
        description="Also require a client certificate signed by client_ca_path (implies tls).",
    )
    auth: Literal["none", "jwt"] = Field(
        "none", description="jwt: every call but health needs a valid bearer token."
    )
    var_dir: Path = Field(Path("var"), description="State root; development files in <var>/tls/.")
    cert_path: Path | None = Field(
        None, description="Server certificate chain (PEM); default <var>/tls/server.pem."
    )
    key_path: Path | None = Field(
        None, description="Server private key (PEM); default <var>/tls/server-key.pem."
    )
    client_ca_path: Path | None = Field(
        None, description="CA bundle client certificates must chain to; default <var>/tls/ca.pem."
    )
    jwks_path: Path | None = Field(
        None, description="JSON Web Key Set that verifies tokens; default <var>/tls/jwks.json."
    )
    jwt_issuer: str = Field("fraudmesh-dev", description="Required `iss` claim of tokens.")
    jwt_audience: str = Field("fraudmesh", description="Required `aud` claim of tokens.")
    subject_rps: int = Field(
        500, ge=1, description="Calls per second one token subject may make (with auth=jwt)."
    )
    max_subjects: int = Field(
        1000, ge=1, description="Subjects with a bucket at once (least recently used evicted)."
    )
    max_request_bytes: int = Field(
        16 * 1024 + 5,
        ge=64,
        description="Largest request body of an API call at the edge: the gateway's message "
        "limit plus the 5-byte gRPC frame header.",
    )
    health_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Plaintext listener routing only grpc.health.v1.Health, for probes that "
        "cannot speak TLS; unset: none.",
    )
    health_address: str = Field("127.0.0.1", description="Address of the health listener.")
    max_in_flight: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Calls Envoy passes to the gateways at once; a call beyond it is refused "
        "at once with RESOURCE_EXHAUSTED and grpc-retry-pushback-ms. Unset: the bootstrap "
        "template's bound (256), which a small machine never reaches before its calls run "
        "late (fraudmesh up sizes it to the cores).",
    )
    niceness: int = Field(
        0,
        ge=-20,
        le=19,
        description="Envoy's niceness relative to the mesh's other processes on one machine "
        "(fraudmesh up): below 0 it answers (and refuses) before the Python services take the "
        "cores; lowering it needs root or CAP_SYS_NICE, without which Envoy keeps 0.",
    )
    pushback_ms: int = Field(
        50,
        ge=0,
        le=60_000,
        description="Milliseconds a refused client should wait before sending again "
        "(grpc-retry-pushback-ms on every refusal at max_in_flight).",
    )

    @model_validator(mode="after")
    def _mtls_needs_tls(self) -> EdgeSettings:
        if self.mtls and not self.tls:
            object.__setattr__(self, "tls", True)
        return self

    def _path(self, given: Path | None, key: str) -> Path:
        return (given or self.var_dir / "tls" / DEV_FILES[key]).resolve()

    @property
    def cert_file(self) -> Path:
        """The server certificate chain Envoy loads."""
        return self._path(self.cert_path, "cert")

    @property
    def key_file(self) -> Path:
        """The server private key Envoy loads."""
        return self._path(self.key_path, "key")

    @property
    def client_ca_file(self) -> Path:
        """The CA bundle client certificates are verified against (mtls)."""
        return self._path(self.client_ca_path, "ca")

    @property
    def jwks_file(self) -> Path:
        """The key set tokens are verified with (auth=jwt)."""
        return self._path(self.jwks_path, "jwks")

    def required_files(self) -> list[Path]:
        """Files Envoy will read with these settings."""
        files: list[Path] = []
        if self.tls:
            files += [self.cert_file, self.key_file]
        if self.mtls:
            files.append(self.client_ca_file)
        if self.auth == "jwt":
            files.append(self.jwks_file)
        return files

    def check_files(self) -> None:
        """Raises FileNotFoundError naming every file Envoy needs that does not exist."""
        missing = [str(p) for p in self.required_files() if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                "edge security files not found: " + ", ".join(missing) + " (development files: "
                "fraudmesh certs --var-dir " + str(self.var_dir) + ")"
            )


class _NoAliases(yaml.SafeDumper):
    """Writes shared nodes out in full: the template's anchors become plain copies."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def apply(config_text: str, settings: EdgeSettings | None = None) -> str:
    """Returns the rendered bootstrap ``config_text`` with the edge hardening of ``settings``."""
    s = settings or EdgeSettings()
    config = yaml.safe_load(config_text)
    listener = _listener(config)
    chain = listener["filter_chains"][0]
    hcm = _hcm(chain)
    _limit_request_size(hcm, s.max_request_bytes)
    _admit(config, hcm, s.max_in_flight, s.pushback_ms)
    if s.auth == "jwt":
        _require_jwt(hcm, s)
    if s.tls:
        chain["transport_socket"] = _tls_socket(s)
    if s.health_port is not None:
        config["static_resources"]["listeners"].append(_health_listener(s, hcm))
    header = "# Rendered by services.common.envoy and services.common.edge_security; do not edit.\n"
    return header + yaml.dump(config, Dumper=_NoAliases, sort_keys=False, width=120)


def _listener(config: dict[str, Any]) -> dict[str, Any]:
    for listener in config["static_resources"]["listeners"]:
        if listener.get("name") == LISTENER:
            found: dict[str, Any] = listener
            return found
    raise ValueError(f"the Envoy bootstrap has no listener named {LISTENER!r}")


def _hcm(chain: dict[str, Any]) -> dict[str, Any]:
    for network_filter in chain["filters"]:
        if network_filter.get("name") == "envoy.filters.network.http_connection_manager":
            hcm: dict[str, Any] = network_filter["typed_config"]
            return hcm
    raise ValueError(f"listener {LISTENER!r} has no HTTP connection manager")


def _routes(hcm: dict[str, Any]) -> dict[str, dict[str, Any]]:
    routes = {
        route.get("name", ""): route
        for host in hcm["route_config"]["virtual_hosts"]
        for route in host["routes"]
    }
    missing = [name for name in (*TOOLING_ROUTES, "grpc") if name not in routes]
    if missing:
        raise ValueError(f"the Envoy bootstrap has no route named {missing}")
    return routes


def _insert_before_router(hcm: dict[str, Any], http_filter: dict[str, Any]) -> None:
    """Adds ``http_filter`` just before grpc_stats and the router (the last filters)."""
    filters: list[dict[str, Any]] = hcm["http_filters"]
    names = [f["name"] for f in filters]
    tail = next(
        i
        for i, n in enumerate(names)
        if n in ("envoy.filters.http.grpc_stats", "envoy.filters.http.router")
    )
    filters.insert(tail, http_filter)


def _limit_request_size(hcm: dict[str, Any], max_bytes: int) -> None:
    """Bounds API request bodies; tooling routes are not buffered (reflection streams)."""
    _insert_before_router(
        hcm,
        {
            "name": "envoy.filters.http.buffer",
            "typed_config": {"@type": _TYPES["buffer"], "max_request_bytes": max_bytes},
        },
    )
    routes = _routes(hcm)
    for name in TOOLING_ROUTES:
        per_filter = routes[name].setdefault("typed_per_filter_config", {})
        per_filter["envoy.filters.http.buffer"] = {
            "@type": _TYPES["buffer_route"],
            "disabled": True,
        }
    # The buffer filter answers 413, which Envoy turns into gRPC UNKNOWN; a client must see
    # RESOURCE_EXHAUSTED, the status gRPC itself uses for a message over the limit.
    mappers = hcm.setdefault("local_reply_config", {}).setdefault("mappers", [])
    mappers.append(
        {
            "filter": {
                "status_code_filter": {
                    "comparison": {
                        "op": "EQ",
                        "value": {"default_value": 413, "runtime_key": "edge_payload_too_large"},
                    }
                }
            },
            "headers_to_add": [
                {
                    "header": {"key": "grpc-status", "value": str(GRPC_RESOURCE_EXHAUSTED)},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
            # Envoy sends a gRPC local reply's body as grpc-message.
            "body": {"inline_string": f"request larger than {max_bytes - 5} bytes"},
        }
    )


def _admit(
    config: dict[str, Any], hcm: dict[str, Any], max_in_flight: int | None, pushback_ms: int
) -> None:
    """Bounds the calls in flight to the gateways; the rest are refused at once.

    Past its capacity a mesh either queues a call (it answers late, or not at all) or refuses
    it. Envoy's circuit breaker on the gateway cluster (the template's, or ``max_in_flight``)
    refuses a call beyond its ``max_requests`` without queueing it anywhere; Envoy answers it
    503 with the response flag UO, which gRPC would read as UNAVAILABLE, an invitation to
    retry at once. The mapper makes it RESOURCE_EXHAUSTED with ``grpc-retry-pushback-ms``, the
    back-off gRPC's retry design (gRFC A6) reads from a server.
    """
    threshold = _cluster(config)["circuit_breakers"]["thresholds"][0]
    if max_in_flight is not None:
        threshold["max_requests"] = max_in_flight
        # HTTP/2 multiplexes every call on one connection: a call waits as pending only
        # while that connection opens; it must not queue there either.
        threshold["max_pending_requests"] = max_in_flight
    # Remaining capacity as gauges: cluster.gateway.circuit_breakers.default.remaining_rq.
    threshold["track_remaining"] = True
    limit = threshold["max_requests"]
    mappers = hcm.setdefault("local_reply_config", {}).setdefault("mappers", [])
    mappers.append(
        {
            "filter": {"response_flag_filter": {"flags": ["UO"]}},
            "headers_to_add": [
                {
                    "header": {"key": "grpc-status", "value": str(GRPC_RESOURCE_EXHAUSTED)},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                },
                {
                    "header": {"key": PUSHBACK_HEADER, "value": str(pushback_ms)},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                },
            ],
            "body": {
                "inline_string": f"the edge is at its limit of {limit} calls in flight; "
                f"retry after {pushback_ms} ms"
            },
        }
    )


def _cluster(config: dict[str, Any]) -> dict[str, Any]:
    for cluster in config["static_resources"]["clusters"]:
        if cluster.get("name") == CLUSTER:
            found: dict[str, Any] = cluster
            return found
    raise ValueError(f"the Envoy bootstrap has no cluster named {CLUSTER!r}")


def _require_jwt(hcm: dict[str, Any], s: EdgeSettings) -> None:
    """Verifies bearer tokens on every route but health; one token bucket per subject."""
    filters: list[dict[str, Any]] = hcm["http_filters"]
    # After the edge's shared bucket (shed before spending CPU on signatures).
    first = 1 if filters and filters[0]["name"] == "envoy.filters.http.local_ratelimit" else 0
    filters[first:first] = [_jwt_filter(s), _subject_rate_limit(s)]


def _jwt_filter(s: EdgeSettings) -> dict[str, Any]:
    """jwt_authn with the local JWKS: every route but health requires a valid token."""
    provider = {
        "issuer": s.jwt_issuer,
        "audiences": [s.jwt_audience],
        "local_jwks": {"filename": str(s.jwks_file)},
        # The token stops at the edge: the gateway, its logs and its traces never see it.
        "forward": False,
        "payload_in_metadata": JWT_METADATA,
        "clock_skew_seconds": 30,
        # A client reuses its token for many calls: verify the signature once per token.
        "jwt_cache_config": {"jwt_cache_size": s.max_subjects},
    }
    return {
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": _TYPES["jwt"],
            "providers": {PROVIDER: provider},
            "rules": [
                {"match": {"prefix": HEALTH_PREFIX}},
                {"match": {"prefix": "/"}, "requires": {"provider_name": PROVIDER}},
            ],
        },
    }


def _subject_rate_limit(s: EdgeSettings) -> dict[str, Any]:
    """A token bucket per token subject."""
    # Per subject, from the verified payload (dynamic metadata), never from a header a
    # client could set. Calls without a subject (health) only meet the shared bucket.
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": _TYPES["ratelimit"],
            "stat_prefix": "edge_subject_rate_limit",
            # The filter needs a default bucket; it is never consumed (see below).
            "token_bucket": {
                "max_tokens": 1_000_000,
                "tokens_per_fill": 1_000_000,
                "fill_interval": "1s",
            },
            "filter_enabled": {
                "runtime_key": "edge_subject_rate_limit_enabled",
                "default_value": {"numerator": 100, "denominator": "HUNDRED"},
            },
            "filter_enforced": {
                "runtime_key": "edge_subject_rate_limit_enforced",
                "default_value": {"numerator": 100, "denominator": "HUNDRED"},
            },
            "always_consume_default_token_bucket": False,
            "rate_limited_as_resource_exhausted": True,
            "max_dynamic_descriptors": s.max_subjects,
            "rate_limits": [
                {
                    "actions": [
                        {
                            "metadata": {
                                "descriptor_key": "subject",
                                "metadata_key": {
                                    "key": "envoy.filters.http.jwt_authn",
                                    "path": [{"key": JWT_METADATA}, {"key": "sub"}],
                                },
                                "source": "DYNAMIC",
                                "skip_if_absent": True,
                            }
                        }
                    ]
                }
            ],
            # An entry without a value is a wildcard: each subject gets its own bucket.
            "descriptors": [
                {
                    "entries": [{"key": "subject"}],
                    # A second's worth of burst, refilled every 100 ms.
                    "token_bucket": {
                        "max_tokens": s.subject_rps,
                        "tokens_per_fill": max(1, s.subject_rps // 10),
                        "fill_interval": "0.1s",
                    },
                }
            ],
        },
    }


def _tls_socket(s: EdgeSettings) -> dict[str, Any]:
    """DownstreamTlsContext: the server certificate, ALPN h2, optionally client certificates."""
    common: dict[str, Any] = {
        "alpn_protocols": ["h2"],
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "tls_certificates": [
            {
                "certificate_chain": {"filename": str(s.cert_file)},
                "private_key": {"filename": str(s.key_file)},
            }
        ],
    }
    context: dict[str, Any] = {"@type": _TYPES["tls"], "common_tls_context": common}
    if s.mtls:
        common["validation_context"] = {"trusted_ca": {"filename": str(s.client_ca_file)}}
        context["require_client_certificate"] = True
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _health_listener(s: EdgeSettings, edge_hcm: dict[str, Any]) -> dict[str, Any]:
    """A plaintext listener that answers grpc.health.v1.Health from the gateway, nothing else."""
    health_route = next(
        route
        for host in edge_hcm["route_config"]["virtual_hosts"]
        for route in host["routes"]
        if route.get("name") == "health"
    )
    route = {key: value for key, value in health_route.items() if key != "typed_per_filter_config"}
    return {
        "name": "edge_health",
        "address": {"socket_address": {"address": s.health_address, "port_value": s.health_port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": _TYPES["hcm"],
                            "stat_prefix": "edge_health",
                            "codec_type": "AUTO",
                            "http_filters": [
                                {
                                    "name": "envoy.filters.http.router",
                                    "typed_config": {"@type": _TYPES["router"]},
                                }
                            ],
                            "route_config": {
                                "name": "edge_health",
                                "virtual_hosts": [
                                    {"name": "health", "domains": ["*"], "routes": [route]}
                                ],
                            },
                        },
                    }
                ]
            }
        ],
    }
