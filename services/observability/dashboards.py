"""Grafana dashboards as code: service health, and the model and the loop.

Each panel's queries name metrics by the catalogue's constants and the recording rules of
``rules``; ``panel_queries`` lists them so a test can check every one with promtool. The
JSON is Grafana's dashboard model (schema 39), with a data source variable, so it imports
into any Grafana with a Prometheus data source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common import metric_catalogue as c
from services.observability import rules


@dataclass(frozen=True)
class Panel:
    """One time-series panel: a title, its queries (PromQL, legend) and the unit."""

    title: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "short"
    description: str = ""


def _rate(name: str, by: str = "", selector: str = "", window: str = "1m") -> str:
    inner = f"rate({name}{selector}[{window}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def service_health() -> list[Panel]:
    """Latency, answers, errors and resources of every process."""
    rpc, score = c.RPC_SERVER_DURATION, c.SCORE_LATENCY
    quantiles = tuple((f"job:{score.name}:{suffix}_rate1m", suffix) for suffix in rules.QUANTILES)
    return [
        Panel(
            "Score latency at the gateway", quantiles, "s", "p50, p90, p99 and p99.9 over 1 minute."
        ),
        Panel(
            "p99.9 per service and method",
            ((f"job_rpc:{rpc.name}:p999_rate1m", "{{job}} {{rpc_method}}"),),
            "s",
            "Server-side time of each call; per request message on streams.",
        ),
        Panel(
            "Late Scores (over 42 ms)",
            tuple((f"fraudmesh:score_late:ratio_rate{w}", w) for w in rules.BURN_WINDOWS),
            "percentunit",
        ),
        Panel(
            "Answers by decision and source",
            (
                (
                    _rate(c.DECISIONS.name, "decision, scored_by, feature_source"),
                    "{{decision}} {{scored_by}} {{feature_source}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Degraded answers",
            (("fraudmesh:answers_degraded:ratio_rate1m", "degraded"),),
            "percentunit",
        ),
        Panel(
            "Server errors",
            ((f"job_rpc:{rpc.name}:errors_ratio_rate5m", "{{job}} {{rpc_method}}"),),
            "percentunit",
        ),
        Panel(
            "Dependency failures",
            ((_rate(c.DEPENDENCY_ERRORS.name, "dependency, reason"), "{{dependency}} {{reason}}"),),
            "reqps",
        ),
        Panel(
            "Breakers (0 closed, 1 half-open, 2 open)",
            ((f"max by (dependency) ({c.BREAKER_STATE.name})", "{{dependency}}"),),
        ),
        Panel(
            "Shed and in flight",
            ((_rate(c.SHED.name), "shed/s"), (f"sum({c.IN_FLIGHT.name})", "in flight")),
        ),
        Panel(
            "GC pauses, p99 by generation",
            (
                (
                    rules._quantile(0.99, c.GC_PAUSE.bucket, "job, generation", window="5m"),
                    "{{job}} gen {{generation}}",
                ),
            ),
            "s",
        ),
        Panel(
            "Event-loop lag, p99",
            ((rules._quantile(0.99, c.EVENT_LOOP_LAG.bucket, "job", window="5m"), "{{job}}"),),
            "s",
        ),
        Panel(
            "CPU per process",
            ((_rate(c.PROCESS_CPU_SECONDS.name, "job"), "{{job}}"),),
            "percentunit",
        ),
        Panel(
            "Resident memory",
            ((f"sum by (job) ({c.PROCESS_RESIDENT_MEMORY.name})", "{{job}}"),),
            "bytes",
        ),
        Panel("Targets up", (("up", "{{job}}"),)),
    ]


def model_and_loop() -> list[Panel]:
    """The model's answers and the live loop behind them."""
    return [
        Panel(
            "Score distribution, p50 and p90 by engine",
            tuple(
                (
                    rules._quantile(q, c.SCORE.bucket, "scored_by", window="5m"),
                    f"p{int(q * 100)} {{{{scored_by}}}}",
                )
                for q in (0.5, 0.9)
            ),
        ),
        Panel(
            "Model answers by route and version",
            (
                (
                    _rate(c.MODEL_ANSWERS.name, "route, model_version"),
                    "{{route}} v{{model_version}}",
                ),
            ),
            "reqps",
        ),
        Panel("Canary share", ((f"max({c.CANARY_PERCENT.name})", "canary"),), "percentunit"),
        Panel(
            "Shadow disagreement",
            (
                (
                    _rate(c.SHADOW_DECISIONS.name, "model_version, answer, shadow", window="5m"),
                    "v{{model_version}} {{answer}}→{{shadow}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Age of the feature rows a Score used, p50 and p99",
            tuple(
                (
                    rules._quantile(q, c.FEATURE_ROW_AGE.bucket, "job", window="5m"),
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.99)
            ),
            "s",
        ),
        Panel(
            "Event to store, p99",
            ((f"job:{c.UPDATER_EVENT_TO_STORE.name}:p99_rate5m", "p99"),),
            "s",
        ),
        Panel("Updater lag", ((f"max({c.UPDATER_CONSUMER_LAG.name})", "lag"),), "s"),
        Panel(
            "Event log: spilled, pending, dropped",
            (
                (_rate(c.EVENTLOG_SPILLED.name), "spilled/s"),
                (f"sum({c.EVENTLOG_SPILL_PENDING.name})", "pending"),
                (_rate(c.EVENTLOG_DROPPED.name), "dropped/s"),
            ),
        ),
        Panel(
            "Decision log lag and unwritten events",
            (
                (f"max({c.DECISIONLOG_LAG.name})", "lag s"),
                (f"max({c.DECISIONLOG_PENDING.name})", "pending"),
            ),
        ),
        Panel(
            "Outcomes reported",
            ((_rate(c.OUTCOMES.name, "outcome", window="5m"), "{{outcome}}"),),
            "reqps",
        ),
    ]


DASHBOARDS = {
    "service-health": ("fraudmesh: service health", service_health),
    "model-and-loop": ("fraudmesh: the model and the loop", model_and_loop),
}
"""uid → (title, panels) of every generated dashboard."""


def panel_queries() -> dict[str, str]:
    """Every query of every dashboard, by ``<uid>/<panel>/<n>`` (for promtool)."""
    return {
        f"{uid}/{i}/{j}": expr
        for uid, (_, panels) in DASHBOARDS.items()
        for i, panel in enumerate(panels())
        for j, (expr, _) in enumerate(panel.queries)
    }


def dashboard(uid: str) -> dict[str, Any]:
    """The Grafana JSON model of one dashboard."""
    title, panels = DASHBOARDS[uid]
    source = {"type": "prometheus", "uid": "${datasource}"}
    return {
        "uid": f"fraudmesh-{uid}",
        "title": title,
        "tags": ["fraudmesh"],
        "schemaVersion": 39,
        "editable": False,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                }
            ]
        },
        "panels": [
            {
                "id": i + 1,
                "type": "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": source,
                "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": source,
                    }
                    for j, (expr, legend) in enumerate(panel.queries)
                ],
            }
            for i, panel in enumerate(panels())
        ],
    }


def render(uid: str) -> str:
    """One dashboard's JSON text."""
    return json.dumps(dashboard(uid), indent=2) + "\n"
