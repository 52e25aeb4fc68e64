"""The project's Prometheus rules, generated from the metric catalogue: recording rules for
the latency quantiles and the objectives' ratios, and the alerts, one file per area.

Each alert carries a summary, a description and a runbook link into
``docs/observability.md``; ``deploy/observability/rules/<area>.test.yml`` holds the
``promtool test rules`` cases that fire it and keep it quiet. Other components add their own
``<area>.rules.yml`` beside these (with its test file); only the files named in ``AREAS`` are
generated here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from services.common import metric_catalogue as c

RUNBOOK = "docs/observability.md"
"""Where each alert's runbook section lives (``#`` the alert's name in lower case)."""

LATENCY_OBJECTIVE_S = 0.042
"""A Score is on time when answered within the 42 ms budget (a bucket bound of its
histogram, so the on-time share is one bucket's count)."""
LATENCY_OBJECTIVE_TARGET = 0.99
"""Share of Scores on time over 28 days; 1 % is the error budget the burn rates spend."""
DEGRADED_THRESHOLD = 0.05
"""Share of answers made without the feature store (default features) or without the model
(the rules) that pages: a dependency is failing."""
PARTIAL_THRESHOLD = 0.3
"""Share of answers with partial features that opens a ticket. A card or terminal seen for
the first time is partial by nature (the simulator's mix has a tenth of them); a third of all
answers means the store has lost or not yet received rows."""
ERROR_THRESHOLD = 0.01
"""Share of calls a server fails (the conventions' server error codes) that pages."""
FRESHNESS_OBJECTIVE_S = 0.05
"""p99 from an event at the gateway to its rows in the online store."""
DECISIONLOG_LAG_S = 300
"""The decision log may trail the event log by five minutes."""

SERVER_ERROR_CODES = "UNKNOWN|DEADLINE_EXCEEDED|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS"
"""gRPC codes that mean the server failed (the OpenTelemetry RPC conventions' list)."""
NOT_SERVING_PATHS = "grpc.health.v1.Health|grpc.reflection.v1.ServerReflection|grpc.reflection.v1alpha.ServerReflection"
"""Tooling services left out of the latency quantiles and error ratios."""

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
"""The recorded quantiles, by the suffix of their rule's name."""
BURN_WINDOWS = ("5m", "30m", "1h", "6h")
"""Windows of the latency objective's multi-window burn-rate alerts."""


@dataclass(frozen=True)
class Recording:
    """A recording rule."""

    record: str
    expr: str

    def to_dict(self) -> dict[str, Any]:
        """As Prometheus reads it."""
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    """An alerting rule with its summary and description (templated) and runbook."""

    alert: str
    expr: str
    summary: str
    description: str
    for_: str = "0m"
    severity: str = "page"

    def to_dict(self) -> dict[str, Any]:
        """As Prometheus reads it."""
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{RUNBOOK}#{self.alert.lower()}",
            },
        }


@dataclass(frozen=True)
class Group:
    """A rule group (evaluated together, in order)."""

    name: str
    rules: list[Recording | Alert] = field(default_factory=list)


def _quantile(q: float, bucket: str, by: str, selector: str = "", window: str = "1m") -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}{selector}[{window}])))"


def latency() -> list[Group]:
    """Quantiles per service and method, and the latency objective's burn rates."""
    rpc, score = c.RPC_SERVER_DURATION, c.SCORE_LATENCY
    served = f'{{rpc_service!~"{NOT_SERVING_PATHS}"}}'
    quantiles: list[Recording | Alert] = [
        Recording(
            f"job_rpc:{rpc.name}:{suffix}_rate1m",
            _quantile(q, rpc.bucket, "job, rpc_service, rpc_method", served),
        )
        for suffix, q in QUANTILES.items()
    ]
    quantiles += [
        Recording(f"job:{score.name}:{suffix}_rate1m", _quantile(q, score.bucket, "job"))
        for suffix, q in QUANTILES.items()
    ]
    objective = repr(LATENCY_OBJECTIVE_S)
    late: list[Recording | Alert] = [
        Recording(
            f"fraudmesh:score_late:ratio_rate{window}",
            f'1 - sum(rate({score.bucket}{{le="{objective}"}}[{window}])) '
            f"/ sum(rate({score.count}[{window}]))",
        )
        for window in BURN_WINDOWS
    ]
    budget = 1 - LATENCY_OBJECTIVE_TARGET
    late += [
        Alert(
            "FraudmeshLatencyBudgetFastBurn",
            f"fraudmesh:score_late:ratio_rate1h > {14.4 * budget:.4g} "
            f"and fraudmesh:score_late:ratio_rate5m > {14.4 * budget:.4g}",
            "Scores are late fast enough to spend the month's latency budget in two days",
            "{{ $value | humanizePercentage }} of Scores took longer than 42 ms over the last "
            "5 minutes, and over the last hour too (objective: 99 % on time).",
            for_="2m",
        ),
        Alert(
            "FraudmeshLatencyBudgetSlowBurn",
            f"fraudmesh:score_late:ratio_rate6h > {6 * budget:.4g} "
            f"and fraudmesh:score_late:ratio_rate30m > {6 * budget:.4g}",
            "Scores are late fast enough to spend the month's latency budget in five days",
            "{{ $value | humanizePercentage }} of Scores took longer than 42 ms over the last "
            "30 minutes, and over the last 6 hours too (objective: 99 % on time).",
            for_="15m",
            severity="ticket",
        ),
    ]
    return [
        Group("fraudmesh-latency-quantiles", quantiles),
        Group("fraudmesh-latency-objective", late),
    ]


def answers() -> list[Group]:
    """Degraded answers, server errors, breakers."""
    d, rpc = c.DECISIONS, c.RPC_SERVER_DURATION
    # Full quality: the model answered, or the cascade's first stage approved a clear case
    # (with features); the small model alone, the rules or default features are degraded.
    served_by_both = f'{d.name}{{scored_by=~"model|first_stage", feature_source!="default"}}'
    served = f'rpc_service!~"{NOT_SERVING_PATHS}"'
    rules: list[Recording | Alert] = [
        Recording(
            "fraudmesh:answers_degraded:ratio_rate1m",
            f"1 - (sum(rate({served_by_both}[1m])) or vector(0)) / sum(rate({d.name}[1m]))",
        ),
        Recording(
            "fraudmesh:answers_partial:ratio_rate5m",
            f'(sum(rate({d.name}{{feature_source="partial"}}[5m])) or vector(0)) '
            f"/ sum(rate({d.name}[5m]))",
        ),
        Recording(
            f"job_rpc:{rpc.name}:errors_ratio_rate5m",
            f'sum by (job, rpc_service, rpc_method) (rate({rpc.count}{{{served}, grpc_code=~"{SERVER_ERROR_CODES}"}}[5m])) '
            f"/ sum by (job, rpc_service, rpc_method) (rate({rpc.count}{{{served}}}[5m]))",
        ),
        Alert(
            "FraudmeshDegradedAnswers",
            f"fraudmesh:answers_degraded:ratio_rate1m > {DEGRADED_THRESHOLD}",
            "Many answers come from default features, the small model alone or the rules",
            "{{ $value | humanizePercentage }} of Scores over the last minute were answered with "
            "default features, by the small model alone or by the rules (threshold "
            f"{DEGRADED_THRESHOLD:.0%}): a dependency is slow, failing or behind an open breaker.",
            for_="1m",
        ),
        Alert(
            "FraudmeshPartialFeatures",
            f"fraudmesh:answers_partial:ratio_rate5m > {PARTIAL_THRESHOLD}",
            "Many answers use partial features",
            "{{ $value | humanizePercentage }} of Scores over 5 minutes found only some of their "
            f"features in the online store (threshold {PARTIAL_THRESHOLD:.0%}; new cards and "
            "terminals are partial by nature): the store lost rows or is not being fed.",
            for_="15m",
            severity="ticket",
        ),
        Alert(
            "FraudmeshServerErrors",
            f"job_rpc:{rpc.name}:errors_ratio_rate5m > {ERROR_THRESHOLD}",
            "{{ $labels.job }} fails {{ $labels.rpc_service }}/{{ $labels.rpc_method }} calls",
            "{{ $value | humanizePercentage }} of {{ $labels.rpc_method }} calls on "
            "{{ $labels.job }} ended in a server error over 5 minutes "
            f"(threshold {ERROR_THRESHOLD:.0%}).",
            for_="5m",
        ),
        Alert(
            "FraudmeshBreakerStuckOpen",
            f"min_over_time({c.BREAKER_STATE.name}[5m]) >= 1",
            "The {{ $labels.dependency }} breaker of {{ $labels.job }} has not closed for 5 minutes",
            "The circuit breaker for {{ $labels.dependency }} stayed open or half-open for 5 "
            "minutes: every Score meanwhile got the fallback for it.",
            severity="ticket",
        ),
    ]
    return [Group("fraudmesh-answers", rules)]


def loop() -> list[Group]:
    """The live loop: feature freshness, the event log, the decision log, canaries."""
    fresh = c.UPDATER_EVENT_TO_STORE
    rules: list[Recording | Alert] = [
        Recording(
            f"job:{fresh.name}:p99_rate5m", _quantile(0.99, fresh.bucket, "job", window="5m")
        ),
        Alert(
            "FraudmeshFeatureFreshness",
            f"job:{fresh.name}:p99_rate5m > {FRESHNESS_OBJECTIVE_S}",
            "Live features reach the store late",
            "p99 from an event at the gateway to its rows in the online store is "
            "{{ $value | humanizeDuration }} over 5 minutes (objective: 50 ms): the next "
            "payment of a card may not see this one.",
            for_="10m",
            severity="ticket",
        ),
        Alert(
            "FraudmeshEventsDropped",
            f"increase({c.EVENTLOG_DROPPED.name}[5m]) > 0",
            "{{ $labels.job }} lost decision or outcome events",
            "{{ $value | humanize }} events could not be stored nor spilled in the last 5 minutes (spill "
            "disk full or cap reached): they are missing from the features and the decision log.",
        ),
        Alert(
            "FraudmeshEventsSpilling",
            f"{c.EVENTLOG_SPILL_PENDING.name} > 0",
            "{{ $labels.job }} is spilling events to local disk",
            "{{ $value | humanize }} events wait in spill files for 5 minutes: the event log backend is down "
            "or slow; they are delivered once it is back, and dropped if the disk fills.",
            for_="5m",
            severity="ticket",
        ),
        Alert(
            "FraudmeshDecisionLogLag",
            # Held, unwritten events are judged per sink: with several sinks, one that owns no
            # partition never flushes while another holds events between its flushes.
            f"max by (job) ({c.DECISIONLOG_LAG.name}) > {DECISIONLOG_LAG_S} "
            f"or on (job) (max by (job, instance) ({c.DECISIONLOG_LAST_FLUSH_AGE.name}) "
            f"> {DECISIONLOG_LAG_S} and max by (job, instance) ({c.DECISIONLOG_PENDING.name}) > 0)",
            "The decision log trails the event log",
            "The decision sink reads events more than 5 minutes old, or holds events it has not "
            "written for 5 minutes: audits, live evaluation and retraining see old data.",
            for_="10m",
            severity="ticket",
        ),
        Alert(
            "FraudmeshCanaryRolledBack",
            f"increase({c.CANARY_ROLLBACKS.name}[15m]) > 0",
            "Canary {{ $labels.model_version }} was rolled back",
            "A gateway found canary {{ $labels.model_version }} beyond its limits and rolled it "
            "back; the live version answers every card again.",
            severity="ticket",
        ),
    ]
    return [Group("fraudmesh-loop", rules)]


def processes() -> list[Group]:
    """Every scraped process."""
    return [
        Group(
            "fraudmesh-processes",
            [
                Alert(
                    "FraudmeshProcessDown",
                    "up == 0",
                    "{{ $labels.job }} at {{ $labels.instance }} is down",
                    "Prometheus could not scrape {{ $labels.job }} for a minute: the process "
                    "is gone, hung or restarting.",
                    for_="1m",
                )
            ],
        )
    ]


AREAS = {"latency": latency, "answers": answers, "loop": loop, "processes": processes}
"""The generated rule files, by area (``<area>.rules.yml``)."""


def render(groups: list[Group]) -> str:
    """A rule file's YAML."""
    document = {
        "groups": [{"name": g.name, "rules": [r.to_dict() for r in g.rules]} for g in groups]
    }
    header = "# Generated by `python -m services.observability` from the metric catalogue; do not edit.\n"
    return header + yaml.safe_dump(document, sort_keys=False, width=120)


def alerts() -> list[Alert]:
    """Every alert the generated files hold."""
    return [
        rule
        for make in AREAS.values()
        for group in make()
        for rule in group.rules
        if isinstance(rule, Alert)
    ]
