"""Fixtures that run the real mesh (Envoy, gateway, features, scorer, redis-server) on free ports."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pytest

from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig

CASCADE_ENV = "FRAUD_GATEWAY_CASCADE"
"""The gateway setting that turns the cascade's first stage on or off."""


@pytest.fixture(scope="session", autouse=True)
def full_path_by_default() -> Iterator[None]:
    """The meshes these tests start run without the cascade's first stage (their processes
    inherit this environment): the tests that judge the scorer's path (scores equal to the
    scorer's, traces through it, recovery probes waiting for the model) need every
    transaction to reach it. test_cascade.py runs the cascade, the product's default, by
    naming it; the small model's fallback is on either way."""
    previous = os.environ.get(CASCADE_ENV)
    os.environ.setdefault(CASCADE_ENV, "false")
    yield
    if previous is None:
        os.environ.pop(CASCADE_ENV, None)


@dataclass(frozen=True)
class Known:
    """Entities that exist in the simulated data."""

    card_id: str
    merchant_id: str
    amount_minor: int
    terminal_id: str


@pytest.fixture(scope="session")
def known(prepared_env: Any) -> Known:
    """A busy card, a merchant it uses, a typical amount of it, and that merchant's busiest
    terminal."""
    tx = pd.read_parquet(prepared_env.data_dir / layout.TRANSACTIONS_FILE)
    tx = tx[tx["currency"] == "EUR"]
    card = tx["card_id"].value_counts().index[0]
    mine = tx[tx["card_id"] == card]
    merchant = str(mine["merchant_id"].value_counts().index[0])
    terminals = tx.loc[tx["merchant_id"] == merchant, "terminal_id"]
    return Known(
        card_id=str(card),
        merchant_id=merchant,
        amount_minor=int(mine["amount_minor"].median()),
        terminal_id=str(terminals.value_counts().index[0]),
    )


def start_mesh(prepared_env: Any, log_dir: Path, store: str = "sqlite", **env: str) -> Mesh:
    """Starts a mesh on the prepared data; with Redis, materializes into the fresh server."""
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir, store=store, log_dir=log_dir, extra_env=env
    )
    mesh = Mesh(config)

    def ready(name: str) -> None:
        if name == "redis":
            settings = FeatureStoreSettings(
                var_dir=prepared_env.var_dir,
                store="redis",
                redis_connection=f"{config.host}:{config.redis_port}",
            )
            store_admin.materialize(settings)

    mesh.start(timeout_s=120, on_ready=ready)
    return mesh


@pytest.fixture(scope="module")
def mesh(prepared_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """A mesh on the embedded SQLite store, shared by a test module."""
    m = start_mesh(prepared_env, tmp_path_factory.mktemp("mesh-logs"))
    yield m
    m.stop()


@pytest.fixture(scope="module")
def edge(mesh: Mesh) -> Iterator[grpc.Channel]:
    """A channel to the mesh's Envoy listener."""
    with grpc.insecure_channel(mesh.config.envoy_target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield channel


def go_tool(name: str) -> str:
    """Path of a tool installed by scripts/tools.sh (PATH or GOPATH/bin); fails if absent."""
    found = shutil.which(name) or shutil.which(name, path=str(Path.home() / "go" / "bin"))
    if found is None:
        pytest.fail(f"{name} is not installed: run `make tools`")
    return found
