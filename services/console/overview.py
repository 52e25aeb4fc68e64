"""The Overview page's figures: what the on-call engineer asks first, as PromQL over the
metric catalogue's names, evaluated by a ``PrometheusSource``.

Every query is written here once; the page shows each figure with the query it came from, so
that a figure can be checked in Prometheus itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from services.common import metric_catalogue as catalogue
from services.console.sources import PrometheusSource, Sample, SourceUnavailable

BUDGET_S = 0.042
"""The latency objective: an answer within 42 ms is on time."""
WINDOW = "1m"
"""Rate window of the live figures."""

_LATENCY = f"sum by (le) (rate({catalogue.SCORE_LATENCY.bucket}[{WINDOW}]))"


@dataclass(frozen=True)
class Figure:
    """One number on the page."""

    key: str
    label: str
    promql: str
    unit: str
    """``per s``, ``ms`` or ``%``: how the value is shown."""
    scale: float = 1.0
    """Multiplies the query's value (seconds to ms, a ratio to percent)."""


FIGURES: tuple[Figure, ...] = (
    Figure(
        "throughput",
        "answers",
        f"sum(rate({catalogue.DECISIONS.name}[{WINDOW}]))",
        "per s",
    ),
    Figure("p50", "p50 latency", f"histogram_quantile(0.5, {_LATENCY})", "ms", 1000.0),
    Figure("p99", "p99 latency", f"histogram_quantile(0.99, {_LATENCY})", "ms", 1000.0),
    Figure("p999", "p99.9 latency", f"histogram_quantile(0.999, {_LATENCY})", "ms", 1000.0),
    Figure(
        "on_time",
        f"answered within {BUDGET_S * 1000:.0f} ms",
        f'sum(rate({catalogue.SCORE_LATENCY.bucket}{{le="{BUDGET_S}"}}[{WINDOW}])) / '
        f"sum(rate({catalogue.SCORE_LATENCY.count}[{WINDOW}]))",
        "%",
        100.0,
    ),
)
"""The headline figures."""


@dataclass(frozen=True)
class Breakdown:
    """A figure split by one label."""

    key: str
    label: str
    promql: str
    by: str
    unit: str
    scale: float = 1.0


BREAKDOWNS: tuple[Breakdown, ...] = (
    Breakdown(
        "feature_source",
        "answers by feature source (default and partial are degraded)",
        f"sum by (feature_source) (rate({catalogue.DECISIONS.name}[{WINDOW}]))",
        "feature_source",
        "per s",
    ),
    Breakdown(
        "scored_by",
        "answers by engine (model and first_stage are full answers; small_model and rules "
        "stand in when the model cannot answer)",
        f"sum by (scored_by) (rate({catalogue.DECISIONS.name}[{WINDOW}]))",
        "scored_by",
        "per s",
    ),
    Breakdown(
        "breakers",
        "circuit breakers (the worst state over the gateways)",
        f"max by (dependency) ({catalogue.BREAKER_STATE.name})",
        "dependency",
        "",
    ),
    Breakdown(
        "alerts",
        "alerts firing",
        'count by (alertname) (ALERTS{alertstate="firing"})',
        "alertname",
        "",
    ),
)
"""The figures split by kind."""

BREAKER_STATES = {0.0: "closed", 1.0: "half-open", 2.0: "open"}
"""``fraudmesh_breaker_state`` values in words."""


@dataclass(frozen=True)
class Shown:
    """A figure's value (None: no data), or why it could not be read."""

    value: float | None = None
    problem: str | None = None


@dataclass(frozen=True)
class OverviewData:
    """Everything the Overview shows at one moment."""

    where: str
    at: float
    """The moment every figure was evaluated at (epoch seconds), so they belong together and
    each can be checked against Prometheus at that same instant."""
    figures: dict[str, Shown] = field(default_factory=dict)
    breakdowns: dict[str, dict[str, float]] = field(default_factory=dict)
    problem: str | None = None
    """Set when the source could not be read at all."""


def _single(samples: list[Sample], scale: float) -> float | None:
    values = [s.value for s in samples if s.value == s.value]  # NaN: no traffic in the window
    return values[0] * scale if values else None


async def load(source: PrometheusSource, at: float | None = None) -> OverviewData:
    """Every figure and breakdown evaluated at ``at`` (default now), queried at once; a source
    that cannot answer at all makes one problem for the page, a query that fails its own."""
    at = time.time() if at is None else at
    queries = [f.promql for f in FIGURES] + [b.promql for b in BREAKDOWNS]
    answers = await asyncio.gather(*(source.query(q, at) for q in queries), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, SourceUnavailable):
            raise answer
    if answers and all(isinstance(a, SourceUnavailable) for a in answers):
        return OverviewData(source.where, at, problem=str(answers[0]))
    figures: dict[str, Shown] = {}
    for figure, answer in zip(FIGURES, answers, strict=False):
        if isinstance(answer, BaseException):
            figures[figure.key] = Shown(problem=str(answer))
        else:
            figures[figure.key] = Shown(_single(answer, figure.scale))
    breakdowns: dict[str, dict[str, float]] = {}
    for breakdown, answer in zip(BREAKDOWNS, answers[len(FIGURES) :], strict=True):
        if isinstance(answer, BaseException):
            breakdowns[breakdown.key] = {}
            continue
        breakdowns[breakdown.key] = {
            s.labels.get(breakdown.by, "?"): s.value * breakdown.scale
            for s in sorted(answer, key=lambda s: s.labels.get(breakdown.by, ""))
        }
    return OverviewData(source.where, at, figures, breakdowns)
