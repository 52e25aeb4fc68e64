"""The edge hardening added to the rendered Envoy bootstrap (Envoy itself validates it in
tests/integration/test_edge_security.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common import edge_security, envoy
from services.common.edge_security import EdgeSettings


def _render(**settings: Any) -> dict[str, Any]:
    text = envoy.render_config(listen_port=18080, admin_port=18081, gateway_port=18082)
    edge = EdgeSettings(var_dir=Path("/srv/fraudmesh"), **settings)
    return dict(yaml.safe_load(edge_security.apply(text, edge)))


def _hcm(config: dict[str, Any], listener: str = "grpc_edge") -> dict[str, Any]:
    found = next(
        entry for entry in config["static_resources"]["listeners"] if entry["name"] == listener
    )
    return dict(found["filter_chains"][0]["filters"][0]["typed_config"])


def _filters(config: dict[str, Any]) -> list[str]:
    return [f["typed_config"].get("stat_prefix", f["name"]) for f in _hcm(config)["http_filters"]]


def _routes(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in _hcm(config)["route_config"]["virtual_hosts"][0]["routes"]}


def test_defaults_bound_request_bodies_only() -> None:
    config = _render()
    assert _filters(config) == [
        "edge_rate_limit",
        "envoy.filters.http.buffer",
        "envoy.filters.http.grpc_stats",
        "envoy.filters.http.router",
    ]
    buffer = _hcm(config)["http_filters"][1]["typed_config"]
    assert buffer["max_request_bytes"] == 16 * 1024 + 5
    routes = _routes(config)
    for name in ("reflection_v1", "reflection_v1alpha", "health"):
        assert routes[name]["typed_per_filter_config"]["envoy.filters.http.buffer"]["disabled"]
    assert "typed_per_filter_config" not in routes["grpc"]
    # The oversized body's mapper, then the admission limit's (below).
    mapper, _ = _hcm(config)["local_reply_config"]["mappers"]
    assert mapper["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 413
    assert mapper["headers_to_add"][0]["header"] == {"key": "grpc-status", "value": "8"}
    listener = config["static_resources"]["listeners"][0]
    assert "transport_socket" not in listener["filter_chains"][0]
    assert len(config["static_resources"]["listeners"]) == 1


def test_the_template_anchors_become_copies() -> None:
    text = edge_security.apply(
        envoy.render_config(listen_port=18080, admin_port=18081, gateway_port=18082)
    )
    assert "&id" not in text and "*id" not in text


def test_tls_serves_h2_with_the_configured_certificate() -> None:
    config = _render(tls=True, cert_path=Path("/etc/tls/edge.crt"))
    socket = config["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
    context = socket["typed_config"]
    common = context["common_tls_context"]
    assert common["alpn_protocols"] == ["h2"]
    assert common["tls_params"]["tls_minimum_protocol_version"] == "TLSv1_2"
    assert common["tls_certificates"][0]["certificate_chain"]["filename"] == "/etc/tls/edge.crt"
    assert (
        common["tls_certificates"][0]["private_key"]["filename"]
        == "/srv/fraudmesh/tls/server-key.pem"
    )
    assert "require_client_certificate" not in context
    assert "validation_context" not in common


def test_mtls_requires_client_certificates_from_the_ca() -> None:
    edge = EdgeSettings(mtls=True)
    assert edge.tls
    config = _render(mtls=True)
    context = config["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"][
        "typed_config"
    ]
    assert context["require_client_certificate"] is True
    ca = context["common_tls_context"]["validation_context"]["trusted_ca"]["filename"]
    assert ca == "/srv/fraudmesh/tls/ca.pem"


def test_jwt_guards_everything_but_health_and_limits_each_subject() -> None:
    config = _render(auth="jwt", subject_rps=50)
    assert _filters(config) == [
        "edge_rate_limit",
        "envoy.filters.http.jwt_authn",
        "edge_subject_rate_limit",
        "envoy.filters.http.buffer",
        "envoy.filters.http.grpc_stats",
        "envoy.filters.http.router",
    ]
    filters = _hcm(config)["http_filters"]
    jwt = filters[1]["typed_config"]
    provider = jwt["providers"][edge_security.PROVIDER]
    assert provider["forward"] is False
    assert provider["local_jwks"]["filename"] == "/srv/fraudmesh/tls/jwks.json"
    assert provider["issuer"] == "fraudmesh-dev" and provider["audiences"] == ["fraudmesh"]
    health_rule, default_rule = jwt["rules"]
    assert health_rule == {"match": {"prefix": "/grpc.health.v1.Health/"}}
    assert default_rule["requires"]["provider_name"] == edge_security.PROVIDER
    limit = filters[2]["typed_config"]
    assert limit["always_consume_default_token_bucket"] is False
    assert limit["rate_limited_as_resource_exhausted"] is True
    (descriptor,) = limit["descriptors"]
    assert descriptor["entries"] == [{"key": "subject"}]
    assert descriptor["token_bucket"]["max_tokens"] == 50
    action = limit["rate_limits"][0]["actions"][0]["metadata"]
    # The subject comes from the verified token, never from a header a client could send.
    assert action["source"] == "DYNAMIC"
    assert action["metadata_key"]["key"] == "envoy.filters.http.jwt_authn"


def test_health_listener_routes_health_only() -> None:
    config = _render(tls=True, auth="jwt", health_port=18083)
    health = _hcm(config, "edge_health")
    routes = health["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["match"]["prefix"] for r in routes] == ["/grpc.health.v1.Health/"]
    assert [f["name"] for f in health["http_filters"]] == ["envoy.filters.http.router"]
    listener = config["static_resources"]["listeners"][1]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18083}
    assert "transport_socket" not in listener["filter_chains"][0]


def test_missing_files_are_named(tmp_path: Path) -> None:
    edge = EdgeSettings(var_dir=tmp_path, tls=True, auth="jwt")
    with pytest.raises(FileNotFoundError) as caught:
        edge.check_files()
    for name in ("server.pem", "server-key.pem", "jwks.json"):
        assert name in str(caught.value)
    EdgeSettings(var_dir=tmp_path).check_files()


def test_a_template_without_the_expected_names_is_refused() -> None:
    with pytest.raises(ValueError, match="grpc_edge"):
        edge_security.apply("static_resources: {listeners: []}\n")


def _gateway_cluster(config: dict[str, Any]) -> dict[str, Any]:
    return dict(next(c for c in config["static_resources"]["clusters"] if c["name"] == "gateway"))


def test_without_a_limit_the_templates_bound_refuses_as_resource_exhausted() -> None:
    config = _render()
    (threshold,) = _gateway_cluster(config)["circuit_breakers"]["thresholds"]
    assert (threshold["max_requests"], threshold["max_pending_requests"]) == (256, 128)
    mapper = next(
        m
        for m in _hcm(config)["local_reply_config"]["mappers"]
        if m["filter"] == {"response_flag_filter": {"flags": ["UO"]}}
    )
    assert "256 calls in flight" in mapper["body"]["inline_string"]


def test_a_limit_refuses_the_excess_as_resource_exhausted_with_a_pushback() -> None:
    config = _render(max_in_flight=7, pushback_ms=30)
    (threshold,) = _gateway_cluster(config)["circuit_breakers"]["thresholds"]
    assert threshold["max_requests"] == 7
    assert threshold["max_pending_requests"] == 7
    assert threshold["retry_budget"]["budget_percent"] == {"value": 20.0}
    mapper = next(
        m
        for m in _hcm(config)["local_reply_config"]["mappers"]
        if m["filter"] == {"response_flag_filter": {"flags": ["UO"]}}
    )
    headers = {h["header"]["key"]: h["header"]["value"] for h in mapper["headers_to_add"]}
    assert headers == {"grpc-status": "8", edge_security.PUSHBACK_HEADER: "30"}
    assert "7 calls in flight" in mapper["body"]["inline_string"]


@pytest.mark.parametrize("field,value", [("max_in_flight", 0), ("pushback_ms", -1)])
def test_a_bad_limit_is_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        EdgeSettings(**{field: value})
