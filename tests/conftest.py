"""Fixtures shared by unit and integration tests.

``prepared_state`` builds the small simulated dataset, the Feast registry and SQLite online
store, and a trained model once per test session (about 10 s), in a temporary folder laid
out like ``var/``. Nothing runs on it: each test module gets its own copy, ``prepared_env``
(a fraction of a second), so that what one module's meshes write (the live loop's feature
updates, decision logs, published models) never reaches what another module reads. Tests
that start services point them at it with ``prepared_env.env``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess

# LightGBM's OpenMP threads spin while they wait by default: on a 2-core machine that also
# runs the services under test, spinning threads starve everyone, and a training that takes
# seconds alone can take minutes. Waiting threads sleep in the tests (set before LightGBM
# loads its OpenMP runtime, here and in every child process).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from services.featurestore import admin
from services.featurestore.settings import FeatureStoreSettings
from services.models import repository
from services.pipelines import dataset, simulate, train

# pytest-xdist's workers are handed the controller's terminal size as COLUMNS and LINES: a
# rich Console created at import would keep that width for good, not the one a test's
# CliRunner sets for its command. The CLI's consoles read the size when they print.
for _size in ("COLUMNS", "LINES"):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop(_size, None)

REPO = Path(__file__).resolve().parents[1]
SHARED_DIR_ENV = "FRAUD_TEST_SHARED_DIR"
"""A folder the pytest processes of one run share what each would build alike."""

# No skip under CI (tests/ci.py); a time limit per integration module, logs on failure
# (tests/timeouts.py); every test's duration kept when asked (tests/durations.py).
pytest_plugins = ("tests.ci", "tests.timeouts", "tests.durations")

# Property tests judge answers, never time: Hypothesis's per-example deadline (200 ms) and its
# too-slow health check fail a correct test on a loaded machine (make test runs lanes side by
# side). No example database either: a run is what the test's seed makes it.
hypothesis.settings.register_profile(
    "fraudmesh",
    deadline=None,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)
hypothesis.settings.load_profile("fraudmesh")


@dataclass(frozen=True)
class PreparedEnv:
    """A ready state folder: data, applied and materialized Feast repo, a published model."""

    var_dir: Path
    """The state root (what ``--var-dir`` / ``FRAUD_*_VAR_DIR`` name)."""
    data_dir: Path
    """Simulated Parquet files (``transactions.parquet`` has the labels)."""
    model_root: Path
    """Published models: ``<model_root>/fraud-lgbm/<version>/``."""
    model_version: str
    """The version trained for this test session."""
    env: dict[str, str]
    """Environment that points every service at this state (SQLite online store)."""

    def store_settings(self, **overrides: Any) -> FeatureStoreSettings:
        """Feature store settings on this state; overrides (e.g. ``store="redis"``) on top."""
        fields: dict[str, Any] = {"var_dir": self.var_dir, "store": "sqlite", **overrides}
        return FeatureStoreSettings(**fields)

    @classmethod
    def at(cls, var_dir: Path, model_version: str) -> PreparedEnv:
        """The prepared state in ``var_dir``."""
        settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
        return cls(
            var_dir=var_dir,
            data_dir=settings.data_path,
            model_root=var_dir / "models",
            model_version=model_version,
            env={
                f"FRAUD_{service}_VAR_DIR": str(var_dir)
                for service in ("GATEWAY", "FEATURES", "SCORER")
            }
            | {"FRAUD_FEATURES_STORE": "sqlite"},
        )

    def copy_to(self, target: Path) -> PreparedEnv:
        """A copy of this state in ``target`` (dataset, Feast registry and online store,
        models), with the stock ``feast`` CLI's feature_store.yaml pointing at the copy."""
        shutil.copytree(self.var_dir, target, symlinks=True, dirs_exist_ok=True)
        copy = PreparedEnv.at(target, self.model_version)
        admin.write_feature_store_yaml(copy.store_settings())
        return copy


@contextlib.contextmanager
def _once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A folder shared by every process of this run (pytest-xdist's workers share the parent of
    their base temporary folders), held under a lock: the first to get it builds what goes in
    it, the others find it built. ``FRAUD_TEST_SHARED_DIR`` names such a folder for several
    pytest processes (``make test``'s lanes); without either it is this process's own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    if os.environ.get(SHARED_DIR_ENV):
        root = Path(os.environ[SHARED_DIR_ENV])
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def go_score_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go client (clients/go/fraudmesh-score), built once per run, statically linked."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is not installed (see scripts/tools.sh)")
    with _once_per_run(tmp_path_factory, "go-client") as folder:
        binary = folder / "fraudmesh-score"
        if not binary.exists():
            built = subprocess.run(
                [go, "build", "-o", str(binary), "./clients/go/fraudmesh-score"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "CGO_ENABLED": "0"},
            )
            assert built.returncode == 0, built.stderr
    return binary


@pytest.fixture(scope="session")
def prepared_state(tmp_path_factory: pytest.TempPathFactory) -> PreparedEnv:
    """Small preset (window ending today, so features are fresh now), applied,
    materialized into SQLite, and a model trained and published on it; only ever copied.
    Built once per run: pytest-xdist's workers copy the first one's."""
    with _once_per_run(tmp_path_factory, "prepared") as var_dir:
        done = var_dir / ".version"
        if not done.exists():
            # What a failed build left behind is not reused.
            for leftover in var_dir.iterdir():
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
            done.write_text(_prepare(var_dir))
        return PreparedEnv.at(var_dir, done.read_text())


def _prepare(var_dir: Path) -> str:
    """Builds the prepared state in ``var_dir``; returns the trained version."""
    settings = FeatureStoreSettings(var_dir=var_dir, store="sqlite")
    sim = simulate.simulate(simulate.preset("small"))
    dataset.write(dataset.Dataset.from_transactions(sim.transactions), settings.data_path)
    admin.apply(settings)
    admin.materialize(settings)
    model_root = var_dir / "models"
    result = train.train(settings, model_root)
    assert result.metadata.version == repository.latest_version(model_root)
    return result.metadata.version


@pytest.fixture(scope="module")
def prepared_env(
    prepared_state: PreparedEnv, tmp_path_factory: pytest.TempPathFactory
) -> PreparedEnv:
    """This module's own copy of the prepared state."""
    return prepared_state.copy_to(tmp_path_factory.mktemp("var"))
