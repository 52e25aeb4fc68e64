"""Settings of the monitor (env prefix ``FRAUD_MONITOR_``).

Which log it reads is the event log's own settings (``FRAUD_EVENTLOG_*``); which model
repository it reads references from is ``ModelServerSettings``' (model root and name).
Defaults of the windows and the advice come from ``MonitorPolicy`` and ``AdvicePolicy``; the
rollout controller's yardsticks are the canary policy (``CanarySettings``: the gateway's
fast guard reads the same ``FRAUD_CANARY_*`` variables).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.models.settings import CanarySettings, ModelServerSettings
from services.monitor.advice import ADVICE_FILE, AdvicePolicy
from services.monitor.engine import MonitorPolicy

_P = MonitorPolicy()
_A = AdvicePolicy()


class MonitorSettings(ModelServerSettings, CanarySettings):
    """The monitor's port, consumer group, state file, windows and advice thresholds."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_MONITOR_", extra="ignore", frozen=True)

    port: int = Field(50056, ge=0, le=65535, description="gRPC port (health and reflection).")
    drain_seconds: float = Field(
        0.0, ge=0, description="Nothing routes calls here: no drain period on SIGTERM."
    )
    group: str = Field(
        "monitor",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Consumer group on the event log (one of FRAUD_EVENTLOG_GROUPS, so that "
        "retention and trimming wait for it).",
    )
    state_dir: Path | None = Field(
        None, description="Folder of the state file and the advice file; default <var_dir>/monitor."
    )
    advice_dir: Path | None = Field(
        None,
        description="Folder of the advice file, which `fraudmesh autopilot` reads; default the "
        "state folder. In a cluster, a folder on the shared state volume that the autopilot's "
        "Job mounts (the state folder is on the monitor's own volume).",
    )
    poll_max_records: int = Field(1000, ge=1, description="Most records taken per poll.")
    poll_timeout_s: float = Field(0.5, gt=0, description="Longest a poll waits for a record.")
    poll_linger_s: float = Field(
        0.25,
        ge=0,
        description="Least time from one poll to the next while the monitor keeps up (its last "
        "poll was not full): events are read a quarter second of traffic at a time rather than "
        "one or two a poll, whose own cost was most of the monitor's CPU; the figures move "
        "every publish_interval_s anyway. 0 polls again at once.",
    )
    checkpoint_interval_s: float = Field(
        2.0,
        gt=0,
        description="The state is written and the log position committed at most this long "
        "after an event was applied; after a crash, up to this much is read again and "
        "skipped as already counted.",
    )
    checkpoint_max_events: int = Field(
        20_000, ge=1, description="A checkpoint is also taken after this many events."
    )
    publish_interval_s: float = Field(
        5.0, gt=0, description="How often the gauges and the advice are recomputed."
    )
    rollout_interval_s: float = Field(
        1.0, gt=0, description="How often the rollout controller looks at a staged rollout."
    )
    retry_backoff_s: float = Field(0.5, gt=0, description="Wait before retrying a failed log.")
    slice_s: int = Field(_P.slice_s, ge=1, le=3600, description="Width of a time slice (s).")
    window_s: int = Field(
        _P.window_s, ge=1, description="Rolling window of the drift and decision-rate gauges (s)."
    )
    retention_s: int = Field(
        _P.retention_s, ge=1, description="How long slices are kept for queries (s)."
    )
    min_decisions: int = Field(
        _P.min_decisions, ge=1, description="Fewest decisions in a window for a PSI figure."
    )
    label_delay_s: float = Field(
        _P.label_delay_s,
        gt=0,
        description="A decision without an outcome counts as genuine once this old "
        "(retraining's label delay); cohorts younger than it are immature.",
    )
    evaluation_days: int = Field(
        _P.evaluation_days, ge=1, description="Matured days the live figures cover."
    )
    index_days: int = Field(
        _P.index_days,
        ge=1,
        description="Days a decision is remembered for its outcome (disk: about 45 bytes a "
        "decision; docs/monitoring.md).",
    )
    advise_psi: float = Field(_A.psi, gt=0, description="PSI from which drift is advice.")
    advise_sustain_s: float = Field(
        _A.sustain_s, ge=0, description="How long drift must hold before it is advice (s)."
    )
    advise_min_frauds: int = Field(
        _A.min_frauds, ge=1, description="Matured frauds before live quality is judged."
    )
    advise_cooldown_s: float = Field(
        _A.cooldown_s, ge=0, description="Least time between two advices of one reason (s)."
    )

    @property
    def state_path(self) -> Path:
        """Folder of the monitor's files."""
        return self.state_dir or self.var_dir / "monitor"

    @property
    def state_file(self) -> Path:
        """The SQLite state file."""
        return self.state_path / "state.db"

    @property
    def advice_file(self) -> Path:
        """The retraining advice (JSON lines)."""
        return (self.advice_dir or self.state_path) / ADVICE_FILE

    def policy(self) -> MonitorPolicy:
        """The windows and horizons these settings say."""
        return MonitorPolicy(
            slice_s=self.slice_s,
            window_s=self.window_s,
            retention_s=self.retention_s,
            min_decisions=self.min_decisions,
            label_delay_s=self.label_delay_s,
            evaluation_days=self.evaluation_days,
            index_days=self.index_days,
        )

    def advice_policy(self) -> AdvicePolicy:
        """The advice thresholds these settings say."""
        return AdvicePolicy(
            psi=self.advise_psi,
            sustain_s=self.advise_sustain_s,
            min_frauds=self.advise_min_frauds,
            cooldown_s=self.advise_cooldown_s,
        )
