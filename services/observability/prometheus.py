"""Prometheus for a local mesh: its scrape configuration and command line.

Every process with a metrics endpoint is a job named after the process (``gateway``,
``features``, ``scorer``, ``updater``, ``decisionlog``, ``envoy``, ``collector``,
``prometheus``); the recording and alert rules are the project's (``RULES_DIR``), so the
same expressions serve the local mesh and Kubernetes.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "observability" / "rules"
"""The project's rule files (``*.rules.yml``), one per area."""

SCRAPE_INTERVAL_S = 5
"""Local scrapes and rule evaluations: often enough that an alert with ``for: 1m`` fires
within two minutes of its cause; Kubernetes uses 15 s."""


def binary() -> Path | None:
    """Prometheus's executable if installed (Debian's package), else None."""
    found = shutil.which("prometheus")
    return Path(found) if found else None


@dataclass(frozen=True)
class PrometheusConfig:
    """What a local Prometheus scrapes, where it listens and keeps its data."""

    port: int
    data_dir: Path
    targets: Mapping[str, str | Sequence[str]]
    """Job name → host:port serving ``/metrics`` (each replica's, for a replicated part: one
    job per part, one instance per replica)."""
    paths: Mapping[str, str] = field(default_factory=dict)
    """Job name → metrics path where it is not ``/metrics`` (Envoy's ``/stats/prometheus``)."""
    rules_dir: Path = RULES_DIR
    host: str = "127.0.0.1"
    scrape_interval_s: int = SCRAPE_INTERVAL_S

    def render(self) -> str:
        """The YAML configuration."""
        jobs = [
            {
                "job_name": job,
                **({"metrics_path": self.paths[job]} if job in self.paths else {}),
                "static_configs": [
                    {"targets": [target] if isinstance(target, str) else list(target)}
                ],
            }
            for job, target in {**self.targets, "prometheus": f"{self.host}:{self.port}"}.items()
        ]
        config = {
            "global": {
                "scrape_interval": f"{self.scrape_interval_s}s",
                "evaluation_interval": f"{self.scrape_interval_s}s",
                "external_labels": {"mesh": "local"},
            },
            "rule_files": [str(self.rules_dir / "*.rules.yml")],
            "scrape_configs": jobs,
        }
        return yaml.safe_dump(config, sort_keys=False)

    def command(self, executable: Path, config_path: Path) -> list[str]:
        """The argv that runs Prometheus: loopback only, exemplars kept, two days of data."""
        return [
            str(executable),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            "--storage.tsdb.retention.time=2d",
            f"--web.listen-address={self.host}:{self.port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ]
