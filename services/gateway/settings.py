"""Settings of the gateway (env prefix ``FRAUD_GATEWAY_``).

A setting that configures a domain object takes its default from that object's dataclass
(``BudgetPolicy``, ``BreakerConfig``, ``StreamSettings``, ``Limits``, ``ShadowPolicy``):
each default is written once, where it is used. The canary policy's settings
(``canary_*`` but the cap) are ``CanarySettings``, which the monitor shares."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.gateway.breaker import BreakerConfig
from services.gateway.budget import BudgetPolicy
from services.gateway.canary import CanaryLimits
from services.gateway.pipeline import CANARY_CAP_S, CASCADE
from services.gateway.shadow import ShadowPolicy
from services.gateway.streams import StreamSettings
from services.gateway.validate import Limits
from services.models.settings import CanarySettings, ModelServerSettings

_BUDGET = BudgetPolicy()
_BREAKER = BreakerConfig()
_STREAMS = StreamSettings()
_LIMITS = Limits()
_SHADOW = ShadowPolicy()
_DAY_S = 86_400.0


def _ms(seconds: float) -> float:
    """Seconds in milliseconds, without the conversion's float error (0.042 s is 42.0 ms)."""
    return round(seconds * 1000, 6)


class GatewaySettings(ModelServerSettings, CanarySettings):
    """Where the dependencies are, how the budget is split, what input is plausible."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_GATEWAY_", extra="ignore", frozen=True)

    port: int = Field(50051, ge=0, le=65535, description="gRPC port of fraud.v1.FraudScoring.")
    drain_seconds: float = Field(
        2.5,
        ge=0,
        description="On SIGTERM: NOT_SERVING this long before refusing calls; covers two of "
        "Envoy's 1 s health checks so the edge stops routing here first.",
    )
    in_process: bool = Field(
        False,
        description="Read the online store and run the model inside the gateway instead of "
        "calling the feature service and the scorer over gRPC (services/gateway/inprocess.py); "
        "the store settings then come from FRAUD_FEATURES_*.",
    )
    transport: Literal["stream", "unary"] = Field(
        "stream",
        description="How the gateway calls its dependencies: 'stream' multiplexes requests "
        "over a few persistent bidirectional streams per dependency (StreamFeatures, "
        "ModelStreamInfer), 'unary' makes one call per request (GetFeatures, ModelInfer).",
    )
    streams: int = Field(
        _STREAMS.streams,
        ge=1,
        le=64,
        description="Persistent streams per dependency (transport 'stream').",
    )
    stream_max_batch: int = Field(
        _STREAMS.max_batch,
        ge=1,
        le=256,
        description="Most requests one stream message may carry: above 1, requests waiting "
        "for the same stream are coalesced (waiting for more to arrive only with "
        "stream_max_queue_delay_us); 1 sends each alone. 16 measured best "
        "(docs/performance.md, side by side).",
    )
    stream_max_queue_delay_us: int = Field(
        round(_STREAMS.max_queue_delay_s * 1e6),
        ge=0,
        le=10_000,
        description="With stream_max_batch above 1: how long (µs) a stream may hold a request "
        "for others to join its message, only while requests come at least this often, and "
        "at most a tenth of the request's deadline (Triton's max queue delay, falling to zero "
        "at low load). 0 never waits: 2000 cut CPU per Score to 0.78x at 700 rps and raised "
        "the median from 3.4 to 7.1 ms (docs/performance.md).",
    )
    stream_max_age_s: float = Field(
        _STREAMS.max_age_s,
        ge=0,
        description="A stream older than this (less up to 20 % jitter) is replaced "
        "gracefully, so streams follow replicas added since; keep it below the servers' "
        "connection-age grace (10 s), after which a closed connection's streams are cut. "
        "0 keeps streams for ever.",
    )
    cascade: bool = Field(
        CASCADE,
        description="Score with each routed version's small model first (in this process) "
        "and approve below its clear-approve threshold without calling the scorer; false "
        "calls the scorer for every transaction. Either way the small model answers, with its "
        "own thresholds, when the scorer cannot (docs/cascade.md).",
    )
    model_reasons: int = Field(
        0,
        ge=0,
        le=64,
        description="How many of the model's own features (their exact TreeSHAP contributions) "
        "a model's REVIEW or DECLINE answer names, largest first (3 is a good choice); 0, the "
        "default, gives the threshold-written reasons only and keeps the trees out of the "
        "gateway: on 2 cores at 100 calls/s, 3 cost 1.03x the CPU per Score, and each gateway "
        '0.8 s of CPU and 45 MB at start (docs/cascade.md, "Reasons from the model").',
    )
    explain_cap_ms: float = Field(
        _ms(_BUDGET.explain_cap_s),
        gt=0,
        description="Longest a model answer waits for its model's reasons; without them in "
        "time it goes with the threshold-written ones.",
    )
    features_target: str = Field("127.0.0.1:50052", description="host:port of the feature service.")
    scorer_target: str = Field("127.0.0.1:50053", description="host:port of the scorer.")
    rules_path: Path | None = Field(
        None, description="Rules fallback file; unset uses the rules shipped with fraudmesh."
    )
    budget_ms: float = Field(
        _ms(_BUDGET.default_s),
        gt=0,
        description="End-to-end budget when the client's deadline is not shorter.",
    )
    reserve_ms: float = Field(
        _ms(_BUDGET.reserve_s),
        ge=0,
        description="Budget kept back for the rules fallback and the reply.",
    )
    features_cap_ms: float = Field(
        _ms(_BUDGET.features_cap_s), gt=0, description="Longest the feature call may take."
    )
    scorer_cap_ms: float = Field(
        _ms(_BUDGET.scorer_cap_s),
        gt=0,
        description="Longest the model call may take before the rules answer.",
    )
    scorer_suspect_cap_ms: float = Field(
        _ms(_BUDGET.scorer_suspect_cap_s),
        gt=0,
        description="Longest the model call may take, when the version has a small model, while "
        "the scorer's last call timed out and none has answered since.",
    )
    scorer_min_ms: float = Field(
        _ms(_BUDGET.scorer_min_s),
        ge=0,
        description="Below this much time left the model is skipped for the rules.",
    )
    max_future_s: float = Field(
        _LIMITS.max_future_s, ge=0, description="Tolerated clock skew ahead."
    )
    max_age_s: float = Field(_LIMITS.max_age_s, gt=0, description="Oldest transaction scored.")
    max_amount_eur: float = Field(
        _LIMITS.max_amount_eur, gt=0, description="Largest plausible amount."
    )
    max_outcome_age_days: float = Field(
        _LIMITS.max_outcome_age_s / _DAY_S,
        gt=0,
        description="Oldest reported_at an outcome report may carry.",
    )
    emit_events: bool = Field(
        True,
        description="Append a decision event per answered Score to the event log "
        "(FRAUD_EVENTLOG_*) after the answer, and take ReportOutcome; false turns the live "
        "loop off at the gateway (ReportOutcome then answers UNAVAILABLE).",
    )
    journal: Literal["write", "fsync", "off"] = Field(
        "write",
        description="Where a decision event goes before the answer is sent. 'write': into "
        "this gateway's journal on local disk (services/eventlog/journal.py), so a killed "
        "gateway loses no answered decision; 'fsync': also wait for the fsync that covers it, "
        "so it survives a power loss, at a group commit's latency per Score, but never past "
        "the budget: an answer sent first (fraudmesh_journal_sync_late_total) is covered as "
        "with 'write' until the next sync ends; 'off': to memory after the answer, where a kill loses the last ~linger_ms "
        "of decisions (docs/reliability.md).",
    )
    outcome_delivery_timeout_s: float = Field(
        2.0,
        ge=0,
        description="ReportOutcome answers once the event log has stored the outcome, waiting "
        "at most this long (then UNAVAILABLE: retry); 0 answers as soon as it is queued.",
    )
    warmup_calls: int = Field(20, ge=0, description="Warm-up calls to each dependency at start.")
    dependency_wait_s: float = Field(
        10.0, ge=0, description="How long start-up waits for the dependencies to be reachable."
    )

    max_request_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request message: a ScoreRequest at every field's limit is under "
        "3 KB; larger ones are RESOURCE_EXHAUSTED (Envoy applies the same bound).",
    )
    max_in_flight: int = Field(
        32,
        ge=1,
        description="Score calls handled at once; beyond it calls are shed with "
        "RESOURCE_EXHAUSTED at once rather than queued past their budget.",
    )
    breaker_window: int = Field(
        _BREAKER.sliding_window_size, ge=1, description="Calls in each breaker's sliding window."
    )
    breaker_minimum_calls: int = Field(
        _BREAKER.minimum_number_of_calls,
        ge=1,
        description="Calls in the window before a breaker judges the rates.",
    )
    breaker_failure_rate: float = Field(
        _BREAKER.failure_rate_threshold,
        gt=0,
        le=100,
        description="Failure rate (percent) that opens a breaker.",
    )
    breaker_slow_rate: float = Field(
        _BREAKER.slow_call_rate_threshold,
        gt=0,
        le=100,
        description="Slow-call rate (percent) that opens a breaker.",
    )
    breaker_wait_s: float = Field(
        _BREAKER.wait_duration_in_open_state_s,
        gt=0,
        description="Time a breaker stays open before half-open probes.",
    )
    breaker_half_open_calls: int = Field(
        _BREAKER.permitted_number_of_calls_in_half_open_state,
        ge=1,
        description="Probe calls when half-open.",
    )
    breaker_max_age_s: float = Field(
        30.0,
        ge=0,
        description="An outcome older than this leaves a breaker's window even before newer "
        "calls push it out: sparse traffic is judged on what a dependency does now, not on "
        "calls of minutes ago; 0: only newer calls push it out.",
    )
    features_slow_ms: float = Field(
        8.0, gt=0, description="A feature call slower than this counts as slow."
    )
    scorer_slow_ms: float = Field(15.0, gt=0, description="A model call slower than this is slow.")

    lifecycle_poll_ms: float = Field(
        200.0,
        gt=0,
        description="How often the lifecycle file (routing.json) is checked; a routing "
        "change takes effect within this plus the load of a version not yet loaded.",
    )
    policy_dir: Path | None = Field(
        None,
        description="Folder of the fraud team's policy versions (``fraudmesh rules``), "
        "checked as often as the lifecycle file; unset: <var_dir>/policy.",
    )
    model_load_timeout_s: float = Field(
        30.0, gt=0, description="Longest the scorer may take to load a newly routed version."
    )
    canary_cap_ms: float = Field(
        _ms(CANARY_CAP_S),
        gt=0,
        description="Longest a canary model call may take; after it the live version answers, "
        "with the rest of the budget.",
    )
    shadow_queue_size: int = Field(
        _SHADOW.size, ge=1, description="Shadow jobs waiting at most; beyond it they are dropped."
    )
    shadow_workers: int = Field(
        _SHADOW.workers, ge=1, description="Shadow worker tasks, each scoring one batch at a time."
    )
    shadow_max_batch: int = Field(
        _SHADOW.max_batch, ge=1, description="Most shadow jobs a worker scores in one model call."
    )
    shadow_linger_ms: float = Field(
        _ms(_SHADOW.linger_s),
        ge=0,
        description="How long shadow jobs gather before a batch is scored (fewer, larger "
        "model calls; nobody waits for a shadow result).",
    )
    shadow_timeout_ms: float = Field(
        _ms(_SHADOW.timeout_s), gt=0, description="Deadline of a shadow model call."
    )

    @property
    def stream_settings(self) -> StreamSettings:
        """The persistent streams' settings."""
        return StreamSettings(
            streams=self.streams,
            max_batch=self.stream_max_batch,
            max_queue_delay_s=self.stream_max_queue_delay_us / 1e6,
            max_age_s=self.stream_max_age_s,
        )

    @property
    def shadow_policy(self) -> ShadowPolicy:
        """How much shadow scoring may take."""
        return ShadowPolicy(
            size=self.shadow_queue_size,
            workers=self.shadow_workers,
            max_batch=self.shadow_max_batch,
            linger_s=self.shadow_linger_ms / 1000,
            timeout_s=self.shadow_timeout_ms / 1000,
        )

    @property
    def canary_limits(self) -> CanaryLimits:
        """The canary watch's limits: the canary policy, which the monitor reads too."""
        return self.canary_policy

    def breaker_config(self, slow_ms: float) -> BreakerConfig:
        """A breaker configuration with the given slow-call threshold."""
        return BreakerConfig(
            sliding_window_size=self.breaker_window,
            minimum_number_of_calls=min(self.breaker_minimum_calls, self.breaker_window),
            failure_rate_threshold=self.breaker_failure_rate,
            slow_call_rate_threshold=self.breaker_slow_rate,
            slow_call_duration_threshold_s=slow_ms / 1000,
            wait_duration_in_open_state_s=self.breaker_wait_s,
            permitted_number_of_calls_in_half_open_state=self.breaker_half_open_calls,
            max_outcome_age_s=self.breaker_max_age_s,
        )

    @property
    def budget_policy(self) -> BudgetPolicy:
        """The budget split in seconds."""
        return BudgetPolicy(
            default_s=self.budget_ms / 1000,
            reserve_s=self.reserve_ms / 1000,
            features_cap_s=self.features_cap_ms / 1000,
            scorer_cap_s=self.scorer_cap_ms / 1000,
            scorer_min_s=self.scorer_min_ms / 1000,
            scorer_suspect_cap_s=self.scorer_suspect_cap_ms / 1000,
            explain_cap_s=self.explain_cap_ms / 1000,
        )

    @property
    def limits(self) -> Limits:
        """Input plausibility limits."""
        return Limits(
            max_future_s=self.max_future_s,
            max_age_s=self.max_age_s,
            max_amount_eur=self.max_amount_eur,
            max_outcome_age_s=self.max_outcome_age_days * _DAY_S,
        )
