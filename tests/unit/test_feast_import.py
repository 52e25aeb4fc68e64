"""Feast imported through ``services.featurestore`` carries no typeguard instrumentation: each
start of the feature service and the updater would otherwise parse and compile Feast's modules
again, about 7 s of CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import {first}
import feast.feature_view
code = feast.feature_view.FeatureView.__init__.__code__
print("instrumented" if "typeguard" in code.co_names else "plain")
"""


def _probe(first: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()


def test_feast_through_the_feature_store_package_is_not_instrumented() -> None:
    assert _probe("services.featurestore.online") == "plain"


def test_feast_alone_is_instrumented_so_the_probe_can_tell() -> None:
    assert _probe("feast") == "instrumented"
