"""Settings of the event log (env prefix ``FRAUD_EVENTLOG_``), shared by its producers and consumers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Backend = Literal["file", "redis", "kafka"]
"""Where the log lives: a local durable file log, Redis Streams, or Kafka."""

FsyncPolicy = Literal["batch", "interval", "never"]
"""When the file log forces data to disk: after every batch, at most every interval, or never."""


class EventLogSettings(BaseSettings):
    """Which backend holds the log, where it is, and how the producer buffers and spills."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_EVENTLOG_", extra="ignore", frozen=True)

    backend: Backend = Field(
        "file", description="file (embedded, no server), redis (Streams) or kafka."
    )
    topic: str = Field(
        "fraud-events",
        pattern=r"^[A-Za-z0-9._-]{1,200}$",
        description="Name of the log: the file log's folder, the Redis stream key, the Kafka topic.",
    )
    groups: tuple[str, ...] = Field(
        ("feature-updater", "decision-sink", "monitor"),
        description="Consumer groups known in advance. They are registered when the log is "
        "opened, so that no backend discards an event one of them has not consumed yet "
        "(file retention, Redis trimming), even before the group first runs.",
    )
    consumer_name: str = Field(
        "main",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Name of this consumer inside its group: the Redis consumer and, with the "
        "topic, the Kafka static member id (<name>.<topic>). Keep it stable across restarts so "
        "that a restarted consumer takes over its own unacknowledged events at once.",
    )
    var_dir: Path = Field(Path("var"), description="Runtime state root.")

    # file backend
    file_dir: Path | None = Field(
        None, description="Folder of the file log; default <var_dir>/eventlog."
    )
    file_segment_bytes: int = Field(
        64 * 1024 * 1024,
        ge=4096,
        description="A segment file is closed and a new one started once it reaches this size "
        "(checked before each batch, so a segment may pass it by one batch); retention "
        "deletes whole segments.",
    )
    file_fsync: FsyncPolicy = Field(
        "interval",
        description="When appends and committed offsets are forced to disk. Every policy "
        "survives a killed process (the data is in the page cache). batch also survives a "
        "power loss for every acknowledged append, at more CPU per batch (docs/eventlog.md); "
        "interval loses at most the last file_fsync_interval_ms to a power loss.",
    )
    file_fsync_interval_ms: float = Field(
        200.0,
        gt=0,
        description="With file_fsync=interval: longest time between fsyncs while appends "
        "come (an idle producer syncs when it falls idle).",
    )
    file_poll_interval_ms: float = Field(
        5.0,
        gt=0,
        description="How often an idle file-log consumer looks for new records when it does "
        "not watch the head (file_watch_head off, or no inotify).",
    )
    file_watch_head: bool = Field(
        True,
        description="An idle file-log consumer sleeps until a writer moves the head (inotify, "
        "Linux) instead of looking every file_poll_interval_ms: no wake-ups without records, "
        "and the first record after a quiet spell read at once.",
    )
    file_retention_check_s: float = Field(
        5.0, ge=0, description="Least time between two retention passes of a file consumer."
    )

    # redis backend
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL of the stream.")
    redis_max_len: int = Field(
        1_000_000,
        ge=1,
        description="Past this length the stream is trimmed, but only of entries every known "
        "group has acknowledged: unconsumed entries are never trimmed.",
    )
    redis_claim_idle_ms: int = Field(
        30_000,
        ge=0,
        description="Pending entries of another consumer of the group idle this long are claimed "
        "(the other consumer is presumed dead).",
    )
    redis_trim_interval_s: float = Field(
        1.0, ge=0, description="Least time between two trimming passes of a consumer."
    )

    # kafka backend
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers.")
    kafka_partitions: int = Field(
        6, ge=1, description="Partitions of the topic when it is created by the log."
    )
    kafka_replication: int = Field(
        1, ge=1, description="Replication factor of the topic when it is created by the log."
    )
    kafka_retention_ms: int = Field(
        7 * 86_400_000,
        ge=-1,
        description="retention.ms of the topic when it is created by the log (-1: forever).",
    )
    kafka_session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="Consumer session timeout: how long a dead consumer keeps its partitions.",
    )
    kafka_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for producers and consumers (security, tuning).",
    )

    # producer buffering and spilling
    buffer_max_events: int = Field(
        100_000,
        ge=1,
        description="Events the producer holds in memory; past this an append goes straight "
        "to the spill file.",
    )
    batch_max_events: int = Field(
        1000, ge=1, description="Most events written to the backend in one batch."
    )
    linger_ms: float = Field(
        20.0,
        ge=0.1,
        description="While events keep coming, the sender sends what has gathered every "
        "linger_ms (one batch each time); after a quiet spell, the first event waits this long "
        "for company. Longer: fewer, larger batches and less CPU per event; shorter: fresher.",
    )
    send_timeout_s: float = Field(
        5.0,
        gt=0,
        description="A backend write that takes longer fails; its events go to the spill file.",
    )
    retry_backoff_s: float = Field(
        0.2, gt=0, description="First wait before retrying a backend that failed."
    )
    retry_backoff_max_s: float = Field(
        2.0, gt=0, description="Longest wait between retries of a backend that keeps failing."
    )
    spill_dir: Path | None = Field(
        None, description="Folder of the spill files; default <var_dir>/eventlog-spill."
    )
    spill_max_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=4096,
        description="Spill files of one producer stop growing here: further events are "
        "dropped (counted and logged), as when the disk is full.",
    )
    close_timeout_s: float = Field(
        10.0,
        ge=0,
        description="On close, how long to keep delivering before the rest is left in the "
        "spill file for the next producer.",
    )

    journal_dir: Path | None = Field(
        None,
        description="Folder of the journals (write-ahead files of producers that make each "
        "event durable before answering); default <var_dir>/eventlog-journal.",
    )

    @property
    def file_path(self) -> Path:
        """Folder of this topic's file log."""
        return (self.file_dir or self.var_dir / "eventlog") / self.topic

    @property
    def spill_path(self) -> Path:
        """Folder of this topic's spill files."""
        return (self.spill_dir or self.var_dir / "eventlog-spill") / self.topic

    @property
    def journal_path(self) -> Path:
        """Folder of this topic's journals."""
        return (self.journal_dir or self.var_dir / "eventlog-journal") / self.topic
