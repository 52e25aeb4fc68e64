"""Where the feature store lives (env prefix ``FRAUD_FEATURES_``): online store, registry,
dataset folder, and how fresh a value must be.

Every process that opens the store (the feature service, a gateway in in-process mode, the
pipelines) reads these same settings; each process's own settings (ports, threads) stay in
its service's settings class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FeatureStoreSettings(BaseSettings):
    """The Feast online and offline stores, the registry and the data folder."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_FEATURES_", extra="ignore", frozen=True)

    var_dir: Path = Field(
        Path("var"), description="Runtime state root: data, Feast registry, models."
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
        description="Socket timeout of request-path Redis reads (connect, send, receive): "
        "a hung Redis fails a read instead of stalling the reader.",
    )
    project: str = Field(
        default="fraudmesh", description="Feast project name (namespaces the stores)."
    )
    data_dir: Path | None = Field(
        default=None,
        description="Folder of the dataset's Parquet files (Feast's offline store); "
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
    terminal_max_age_s: float | None = Field(
        default=None,
        gt=0,
        description="Terminal features older than this (seconds) are STALE; unset uses the "
        "terminal view's TTL.",
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


def from_env(**overrides: Any) -> FeatureStoreSettings:
    """Settings from the environment, with the non-None ``overrides`` (field names) on top."""
    return FeatureStoreSettings(**{k: v for k, v in overrides.items() if v is not None})
