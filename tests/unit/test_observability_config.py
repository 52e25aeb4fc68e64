"""The observability configuration: the trace plan from the standard variables and the
project's settings, and the collector's, Prometheus's and Envoy's rendered configurations,
each checked by the real program (otelcol-fraudmesh validate, promtool check config,
envoy --mode validate)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.common import envoy
from services.common.telemetry import OtelEnvironment, plan
from services.mesh import Mesh, MeshConfig
from services.observability import collector, prometheus


def _env(**values: str) -> OtelEnvironment:
    return OtelEnvironment.model_validate(values)


def test_the_project_setting_samples_its_share_of_new_traces() -> None:
    p = plan("gateway", "otlp", 0.1, _env())
    assert (p.exporter, p.sampler, p.ratio, p.root_share) == (
        "otlp",
        "parentbased_traceidratio",
        0.1,
        0.1,
    )
    assert p.endpoint == "http://localhost:4317" and p.service_name == "fraudmesh-gateway"
    assert not plan("gateway", "off", 0.1, _env()).enabled


def test_the_standard_variables_win_as_in_the_sdk() -> None:
    # An exporter chosen by OTEL_TRACES_EXPORTER without a sampler records every trace.
    p = plan("gateway", "off", 0.1, _env(otel_traces_exporter="otlp"))
    assert (p.exporter, p.sampler, p.root_share) == ("otlp", "parentbased_always_on", 1.0)
    p = plan(
        "scorer",
        "otlp",
        0.1,
        _env(
            otel_traces_sampler="traceidratio",
            otel_traces_sampler_arg="0.25",
            otel_exporter_otlp_endpoint="http://collector:4318/",
            otel_exporter_otlp_protocol="http/protobuf",
            otel_service_name="scoring",
        ),
    )
    assert (p.sampler, p.ratio, p.protocol) == ("traceidratio", 0.25, "http/protobuf")
    assert p.endpoint == "http://collector:4318/v1/traces" and p.service_name == "scoring"
    assert not plan("gateway", "otlp", 0.1, _env(otel_traces_exporter="none")).enabled


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"otel_traces_exporter": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"otel_traces_sampler": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        (
            {"otel_traces_sampler": "traceidratio", "otel_traces_sampler_arg": "2"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        ({"otel_exporter_otlp_protocol": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_a_bad_variable_is_named(variables: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        plan("gateway", "otlp", 0.1, _env(**variables))


def test_the_collector_accepts_its_configuration(tmp_path: Path) -> None:
    binary = collector.binary()
    if binary is None:
        pytest.fail("otelcol-fraudmesh is not installed: run `make tools`")
    path = tmp_path / "collector.yaml"
    config = collector.CollectorConfig(4317, 8888, tmp_path / "t.jsonl", 10, "http://backend:4317")
    path.write_text(config.render())
    checked = subprocess.run(
        [str(binary), "validate", "--config", f"file:{path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    policies = {p["name"] for p in collector.tail_policies(10)}
    assert policies == {
        "errors",
        "over-the-latency-objective",
        "review-and-decline",
        "share-of-the-rest",
    }


def test_prometheus_accepts_its_configuration(tmp_path: Path) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run `make system`")
    config = prometheus.PrometheusConfig(
        port=9090,
        data_dir=tmp_path / "data",
        targets={"gateway": "127.0.0.1:9101", "envoy": "127.0.0.1:9901"},
        paths={"envoy": "/stats/prometheus"},
    )
    path = tmp_path / "prometheus.yml"
    path.write_text(config.render())
    checked = subprocess.run(
        [tool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_envoy_accepts_its_tracer(tmp_path: Path) -> None:
    text = envoy.render_config(
        listen_port=18080,
        admin_port=19901,
        gateway_port=15051,
        tracing=envoy.EnvoyTracing("127.0.0.1", 14317, 10),
    )
    assert "envoy.tracers.opentelemetry" in text
    assert "sampling_percentage: { numerator: 100000, denominator: MILLION }" in text
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    checked = subprocess.run(
        [str(envoy.envoy_binary()), "--mode", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_without_observability_the_mesh_has_neither_process(tmp_path: Path) -> None:
    mesh = Mesh(MeshConfig(var_dir=tmp_path, log_dir=tmp_path / "logs"))
    assert "prometheus" not in mesh.processes and "collector" not in mesh.processes
    assert mesh.envoy_tracing() is None


def test_with_its_collector_the_mesh_traces_its_share_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    if collector.binary() is None:
        pytest.fail("otelcol-fraudmesh is not installed: run `make tools`")
    config = MeshConfig(
        var_dir=tmp_path, log_dir=tmp_path / "logs", observability=True, otlp_port=14317
    )
    mesh = Mesh(config)
    assert mesh.processes["collector"].optional
    tracing = mesh.envoy_tracing()
    assert tracing is not None and (tracing.collector_port, tracing.sample_percent) == (14317, 10)
    gateway_env = mesh.processes["gateway"].env
    assert gateway_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:14317"
    assert gateway_env["FRAUD_GATEWAY_TRACING"] == "otlp"
    assert gateway_env["OTEL_SERVICE_NAME"] == "fraudmesh-gateway"
