"""Settings of the live feature updater (env prefix ``FRAUD_UPDATER_``).

Where the online store is comes from ``FeatureStoreSettings`` (``FRAUD_FEATURES_*``) and
where the event log is from ``EventLogSettings`` (``FRAUD_EVENTLOG_*``), both built by
``__main__`` like in every other process that uses them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class UpdaterSettings(ServerSettings):
    """How the updater consumes, checkpoints and caches."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_UPDATER_", extra="ignore", frozen=True)

    port: int = Field(50054, ge=0, le=65535, description="gRPC port (health and reflection).")
    drain_seconds: float = Field(
        0.0, ge=0, description="Nothing routes calls here: no drain period on SIGTERM."
    )
    group: str = Field(
        "feature-updater",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Consumer group on the event log (one of FRAUD_EVENTLOG_GROUPS, so that "
        "retention and trimming wait for it).",
    )
    poll_max_records: int = Field(500, ge=1, description="Most records taken per poll.")
    poll_timeout_s: float = Field(
        0.25, gt=0, description="Longest a poll waits for the first record."
    )
    checkpoint_interval_s: float = Field(
        1.0,
        gt=0,
        description="Entity states are saved and the log position committed at most this long "
        "after an event was applied (online rows are written at once, per poll). After a "
        "crash, up to this much is consumed again and applied idempotently.",
    )
    checkpoint_max_events: int = Field(
        20_000, ge=1, description="A checkpoint is also taken after this many applied events."
    )
    state_path: Path | None = Field(
        None, description="SQLite file of the entity states; default <var_dir>/updater/state.db."
    )
    cache_max_entities: int = Field(
        200_000,
        ge=1,
        description="Entity states kept in memory per view; beyond, the least recently used "
        "ones are left to the state file (read back on their next event).",
    )
    max_pending_labels: int = Field(
        100_000,
        ge=0,
        description="Outcomes held for transactions whose decision has not been consumed yet "
        "(the log orders outcomes by transaction, decisions by card); the oldest go first.",
    )
    seed: bool = Field(
        True,
        description="Build the entity states from the dataset's transactions when the state "
        "file is new or the dataset changed, so that live rows continue the batch history.",
    )
    store_timeout_ms: float = Field(
        1000.0, gt=0, description="Socket timeout of online-store writes (Redis)."
    )
    retry_backoff_s: float = Field(
        0.5, gt=0, description="Wait before retrying a log or store that failed."
    )
    list_sweep_s: float = Field(
        5.0,
        ge=0,
        description="How often expired entries of the fraud team's lists are audited on the "
        "event log and swept off the store (an expired entry matches nothing meanwhile); "
        "a sweep reads one counter while nothing changed and nothing expired. 0: never.",
    )

    partitioned: bool = Field(
        False,
        description="Run as one member of a partitioned group (Kafka only): card windows per "
        "partition of the event log, merchant and terminal windows per partition of the "
        "merchant-keyed topic it forwards to; start as many members as partitions, each "
        'with its own FRAUD_EVENTLOG_CONSUMER_NAME (docs/liveloop.md, "Several updaters").',
    )
    partition_path: Path | None = Field(
        None,
        description="Folder of a partitioned group's state files (one per partition, and the "
        "seed they share), on a file system every member reaches; default "
        "<var_dir>/updater/<group>.",
    )

    @property
    def partition_dir(self) -> Path:
        """The folder of a partitioned group's state files."""
        return self.partition_path or self.var_dir / "updater" / self.group

    @property
    def state_file(self) -> Path:
        """The SQLite file of the entity states."""
        return self.state_path or self.var_dir / "updater" / "state.db"
