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


OFFLINE_PROBE = """
import sys
from services.featurestore import admin
from services.featurestore.settings import FeatureStoreSettings
store = admin.feature_store(FeatureStoreSettings(var_dir=sys.argv[1]))
print("dask" if any(m.split(".")[0] == "dask" for m in sys.modules) else "no dask")
print(type(store.config.offline_store).__name__)
print("dask" if any(m.split(".")[0] == "dask" for m in sys.modules) else "no dask")
"""


def test_a_feature_store_imports_the_offline_store_only_when_it_is_used(tmp_path: Path) -> None:
    # The online readers and writers (feature service, updater, gateways in process) build a
    # FeatureStore and never query the offline store: its Dask import would cost each start.
    lines = subprocess.run(
        [sys.executable, "-c", OFFLINE_PROBE, str(tmp_path / "var")],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    assert lines == ["no", "dask", "AsofFileOfflineStoreConfig", "dask"]


def test_the_offline_store_is_named_as_the_store_names_itself() -> None:
    from services.featurestore import admin, offline

    assert admin.OFFLINE_STORE_TYPE == offline.STORE_TYPE
