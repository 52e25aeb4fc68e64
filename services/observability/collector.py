"""The OpenTelemetry Collector of a local mesh: where its binary is, and its configuration.

The collector (``otelcol-fraudmesh``, built by ``make tools``) receives the mesh's spans over
OTLP/gRPC, waits until each trace is complete, keeps it by the project's tail-sampling policy
(``TAIL_POLICIES``) and appends what it keeps to a file under the state folder as OTLP JSON
lines; with a downstream OTLP endpoint it forwards the same traces there too, over OTLP/gRPC
or OTLP/HTTP (``http/protobuf``) as the endpoint's protocol says.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

BINARY = "otelcol-fraudmesh"
"""The collector's executable name (PATH or the Go tools folder)."""

LATENCY_OBJECTIVE_MS = 42
"""A trace whose root took longer than the scoring budget is kept whatever it answered."""

DECISION_WAIT_S = 5
"""How long the collector holds a trace's spans before it decides: a Score's spans are all
ended within its 50 ms edge timeout, and the services export every second."""


def binary() -> Path | None:
    """The collector's executable if installed (PATH, else ~/go/bin), else None."""
    found = shutil.which(BINARY) or shutil.which(BINARY, path=str(Path.home() / "go" / "bin"))
    return Path(found) if found else None


def tail_policies(keep_percent: float) -> list[dict[str, Any]]:
    """The tail-sampling policy: a trace is kept when any of these says so."""
    return [
        {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
        {
            "name": "over-the-latency-objective",
            "type": "latency",
            "latency": {"threshold_ms": LATENCY_OBJECTIVE_MS},
        },
        {
            "name": "review-and-decline",
            "type": "string_attribute",
            "string_attribute": {"key": "fraudmesh.decision", "values": ["review", "decline"]},
        },
        {
            "name": "share-of-the-rest",
            "type": "probabilistic",
            "probabilistic": {"sampling_percentage": keep_percent},
        },
    ]


@dataclass(frozen=True)
class CollectorConfig:
    """What a local collector listens on and where it writes."""

    otlp_port: int
    metrics_port: int
    traces_path: Path
    keep_percent: float = 10.0
    """Share of ordinary traces (no error, on time, approved) kept, in percent."""
    downstream: str | None = None
    """An OTLP endpoint that gets every kept trace as well: ``http://host:port`` for gRPC, the
    traces URL (``http://host:port/v1/traces``) for ``http/protobuf``."""
    downstream_protocol: Literal["grpc", "http/protobuf"] = "grpc"
    host: str = "127.0.0.1"
    http_port: int | None = None
    """Also receive OTLP/HTTP on this port (None: OTLP/gRPC only)."""

    def render(self) -> str:
        """The collector's YAML configuration."""
        exporters: dict[str, Any] = {"jsonfile": {"path": str(self.traces_path)}}
        if self.downstream and self.downstream_protocol == "http/protobuf":
            exporters["otlphttp/downstream"] = {"traces_endpoint": self.downstream}
        elif self.downstream:
            target = urlsplit(self.downstream)
            exporters["otlp/downstream"] = {
                "endpoint": target.netloc or self.downstream,
                "tls": {"insecure": target.scheme != "https"},
            }
        protocols: dict[str, Any] = {"grpc": {"endpoint": f"{self.host}:{self.otlp_port}"}}
        if self.http_port is not None:
            protocols["http"] = {"endpoint": f"{self.host}:{self.http_port}"}
        config = {
            "receivers": {"otlp": {"protocols": protocols}},
            "processors": {
                "tail_sampling": {
                    "decision_wait": f"{DECISION_WAIT_S}s",
                    "num_traces": 100_000,
                    "expected_new_traces_per_sec": 1_000,
                    "policies": tail_policies(self.keep_percent),
                },
                "batch": {"timeout": "1s"},
            },
            "exporters": exporters,
            "service": {
                "telemetry": {
                    "logs": {"level": "warn"},
                    "metrics": {
                        "level": "normal",
                        "readers": [
                            {
                                "pull": {
                                    "exporter": {
                                        "prometheus": {
                                            "host": self.host,
                                            "port": self.metrics_port,
                                        }
                                    }
                                }
                            }
                        ],
                    },
                },
                "pipelines": {
                    "traces": {
                        "receivers": ["otlp"],
                        "processors": ["tail_sampling", "batch"],
                        "exporters": list(exporters),
                    }
                },
            },
        }
        return yaml.safe_dump(config, sort_keys=False)


def command(executable: Path, config_path: Path) -> list[str]:
    """The argv that runs the collector on ``config_path``."""
    return [str(executable), "--config", f"file:{config_path}"]
