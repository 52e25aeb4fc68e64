"""Settings of the decision sink process (env prefix ``FRAUD_DECISIONLOG_``).

Which log it reads is the event log's own settings (``services.eventlog.EventLogSettings``,
``FRAUD_EVENTLOG_*``), shared with the gateway and the feature updater; this class holds
where the Parquet tables go and when the sink flushes.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServerSettings


class DecisionLogSettings(ServerSettings):
    """The sink's port, its consumer group, the tables' folder and the flush policy."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_DECISIONLOG_", extra="ignore", frozen=True)

    port: int = Field(
        default=50055,
        ge=0,
        le=65535,
        description="gRPC port of the sink's health service (it serves no other API).",
    )
    drain_seconds: float = Field(
        0.0,
        ge=0,
        description="On SIGTERM: how long to report NOT_SERVING first; nothing routes calls "
        "to the sink, so it need not wait.",
    )
    group: str = Field(
        "decision-sink",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Consumer group on the event log. Keep it among the event log's declared "
        "groups (FRAUD_EVENTLOG_GROUPS) so that no backend discards events before the sink "
        "has written them.",
    )
    root: Path | None = Field(
        None, description="Folder of the decision log's tables; default <var_dir>/decisions."
    )
    flush_interval_s: float = Field(
        4.0,
        gt=0,
        le=300,
        description="Longest time a polled event waits before it is written to a Parquet part "
        "and the log position committed. An event is durable at most this plus poll_linger_s "
        "plus one flush after it reached the log: under 5 s by default (also the delay of "
        "`fraudmesh decisions tail`). Shorter means more, smaller parts.",
    )
    max_part_rows: int = Field(
        20_000,
        ge=1,
        description="A flush starts once this many events are gathered (while catching up); "
        "it bounds the sink's memory (docs/decisionlog.md).",
    )
    poll_max_records: int = Field(
        2000, ge=1, description="Most records taken from the event log by one poll."
    )
    poll_timeout_s: float = Field(
        0.5, gt=0, description="How long an idle poll waits for the first record."
    )
    poll_linger_s: float = Field(
        0.25,
        ge=0,
        description="After a poll that drained the log, wait this long before the next one, "
        "so that polls are few and large while events trickle in (each poll costs a round "
        "trip and its bookkeeping; the sink has seconds to write an event, not milliseconds).",
    )
    file_poll_interval_ms: float = Field(
        50.0,
        gt=0,
        description="On the file log, where the sink cannot watch the head (no inotify): how "
        "often an idle sink looks for new records. It replaces "
        "FRAUD_EVENTLOG_FILE_POLL_INTERVAL_MS for the sink, which has seconds to write an "
        "event, not milliseconds (idle CPU by poll interval: docs/decisionlog.md).",
    )
    dedupe_window: int = Field(
        200_000,
        ge=0,
        description="Event ids of this many recent events are remembered, so that an event "
        "delivered twice (a producer retrying a batch in doubt, a redelivery after an error) "
        "is written once. Readers also deduplicate by event id.",
    )
    compression: str = Field(
        "zstd", description="Parquet compression codec of the parts (zstd, snappy, none)."
    )
    retention_days: int | None = Field(
        None,
        ge=1,
        description="Day partitions older than this many days are deleted (checked hourly); "
        "unset keeps everything. The log holds card ids and amounts: see docs/decisionlog.md.",
    )
    retry_backoff_s: float = Field(
        0.2, gt=0, description="First wait before retrying the backend or the disk after a failure."
    )
    retry_backoff_max_s: float = Field(
        5.0, gt=0, description="Longest wait between retries of a failing backend or disk."
    )
    close_timeout_s: float = Field(
        8.0,
        ge=0,
        description="On SIGTERM: how long to keep reading what is already on the log, write "
        "it and commit. Whatever is left is read again by the next start.",
    )

    @property
    def root_path(self) -> Path:
        """Folder of the decision log's tables."""
        return self.root or self.var_dir / "decisions"
