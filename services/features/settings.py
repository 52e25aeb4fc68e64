"""Settings of the feature service and the data pipeline (env prefix ``FRAUD_FEATURES_``)."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class FeaturesSettings(ServerSettings):
    """Where the Feast registry, online store and data live, and how reads are judged."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_FEATURES_", extra="ignore", frozen=True)

    port: int = Field(
        default=50052, ge=0, le=65535, description="gRPC port of fraud.v1.FeatureService."
    )
    store: Literal["sqlite", "redis"] = Field(
        default="sqlite", description="Online store: embedded SQLite file, or a Redis server."
    )
    redis_connection: str = Field(
        default="127.0.0.1:6379",
        description="Redis connection string in Feast's form: host:port[,db=N][,password=…].",
    )
    redis_timeout_ms: float = Field(
        default=20.0,
        gt=0,
        description="Socket timeout of the feature service's Redis reads (connect, send, "
        "receive): a hung Redis fails a read instead of stalling the service.",
    )
    project: str = Field(
        default="fraudmesh", description="Feast project name (namespaces the stores)."
    )
    data_dir: Path | None = Field(
        default=None,
        description="Folder of the simulated Parquet files (Feast's offline store); "
        "default <var_dir>/data.",
    )
    registry_path: Path | None = Field(
        default=None, description="Feast registry file; default <var_dir>/feast/registry.db."
    )
    online_path: Path | None = Field(
        default=None, description="SQLite online-store file; default <var_dir>/feast/online.db."
    )
    card_max_age_s: float | None = Field(
        default=None,
        gt=0,
        description="Card features older than this (seconds) are STALE; unset uses the "
        "card view's TTL, which training's point-in-time join applies too.",
    )
    merchant_max_age_s: float | None = Field(
        default=None,
        gt=0,
        description="Merchant features older than this (seconds) are STALE; unset uses the "
        "merchant view's TTL.",
    )
    read_in_thread: bool = Field(
        False,
        description="Run each online read in a worker thread instead of on the event loop: "
        "protects health checks from a store that hangs, at ~1-4 ms more per read.",
    )
    read_threads: int = Field(
        default=1,
        ge=1,
        description="Worker threads for the blocking Feast reads; the reader serializes "
        "reads, so more threads only queue behind one another.",
    )
    sim_preset: Literal["default", "small"] = Field(
        default="default",
        description="Simulator size: default (~200k transactions) or small (~40k).",
    )
    sim_seed: int = Field(default=7, description="Simulator seed; equal seeds give identical data.")
    sim_end: date | None = Field(
        default=None, description="Simulated window's end (UTC midnight); unset means today."
    )

    @property
    def data_path(self) -> Path:
        """The folder of the Parquet files."""
        return self.data_dir or self.var_dir / "data"

    @property
    def registry_file(self) -> Path:
        """The Feast registry file."""
        return self.registry_path or self.var_dir / "feast" / "registry.db"

    @property
    def online_file(self) -> Path:
        """The SQLite online-store file."""
        return self.online_path or self.var_dir / "feast" / "online.db"


def from_env(**overrides: Any) -> FeaturesSettings:
    """Settings from the environment, with the non-None ``overrides`` (field names) on top."""
    return FeaturesSettings(**{k: v for k, v in overrides.items() if v is not None})
