"""Where the Overview and the Models page get what is measured elsewhere: a small client of
Prometheus' HTTP query API, and the monitor's gauges, read from the monitor's own metrics page
or, without one, from Prometheus.

Both are seams: the pages depend on the ``PrometheusSource`` and ``MonitorSource`` protocols,
so that a test can hand them fixed figures and another deployment another backend.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from services.common import metric_catalogue as catalogue


class SourceUnavailable(Exception):
    """The source cannot answer now (not configured, not reachable, or an error): the message
    says which, for the page to show."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant query's answer."""

    labels: dict[str, str]
    value: float


class PrometheusSource(Protocol):
    """Instant PromQL queries."""

    @property
    def where(self) -> str:
        """Where the figures come from, for the page (e.g. the server's URL)."""
        ...

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """The series of an instant query at ``at`` (epoch seconds; None: now), a scalar as one
        unlabelled sample; raises SourceUnavailable."""
        ...


def parse_answer(body: bytes) -> list[Sample]:
    """The samples of a ``/api/v1/query`` answer; raises SourceUnavailable for an error."""
    try:
        answer = json.loads(body)
    except ValueError as error:
        raise SourceUnavailable(
            f"Prometheus answered something that is not JSON: {error}"
        ) from None
    if answer.get("status") != "success":
        raise SourceUnavailable(f"Prometheus refused the query: {answer.get('error', answer)}")
    data = answer.get("data", {})
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [Sample({}, float(result[1]))]
    if kind == "vector":
        return [Sample(dict(r.get("metric", {})), float(r["value"][1])) for r in result]
    raise SourceUnavailable(f"Prometheus answered a {kind} to an instant query")


class HttpPrometheus:
    """Prometheus' HTTP API at ``url`` (its own origin: the browser never calls it)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    @property
    def where(self) -> str:
        """The server's URL."""
        return self.url

    def _get(self, promql: str, at: float | None) -> bytes:
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v1/query?{query}", timeout=self.timeout_s
            ) as reply:
                return bytes(reply.read())
        except urllib.error.HTTPError as error:
            # Prometheus answers a bad query with 400 and its JSON error.
            return bytes(error.read())
        except OSError as error:
            raise SourceUnavailable(
                f"Prometheus at {self.url} is not reachable ({error})"
            ) from None

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Runs ``promql`` off the event loop."""
        return parse_answer(await asyncio.to_thread(self._get, promql, at))


class NoPrometheus:
    """No Prometheus configured."""

    where = "no Prometheus configured (FRAUD_CONSOLE_PROMETHEUS_URL)"

    async def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Always unavailable."""
        raise SourceUnavailable(self.where)


@dataclass(frozen=True)
class Interval:
    """A figure with its 95 % interval."""

    low: float
    estimate: float
    high: float


@dataclass(frozen=True)
class LiveQuality:
    """Live quality of one version over its matured or its immature cohorts."""

    precision: dict[str, float] = field(default_factory=dict)
    """By threshold (review, decline); absent where nothing was flagged."""
    recall: dict[str, float] = field(default_factory=dict)
    """By threshold; absent without a labelled fraud."""
    average_precision: float | None = None
    labelled_ratio: float | None = None
    frauds: float | None = None
    """Decisions labelled fraud: how much the figures stand on."""


MATURITIES = ("matured", "immature")
"""Cohorts older than the label delay, then the younger ones (labelled by outcomes so far)."""


@dataclass(frozen=True)
class VersionQuality:
    """What the monitor measures of one model version on live traffic."""

    version: str
    psi: dict[str, float] = field(default_factory=dict)
    """Population stability index by feature ("score" for the score) against the version's
    reference, over the monitor's rolling window; absent below its minimum decisions."""
    missing: dict[str, float] = field(default_factory=dict)
    """Share of the window's decisions in which the feature took its default."""
    decisions: dict[str, float] = field(default_factory=dict)
    """Decisions in the window by arm (live, canary, shadow)."""
    decision_ratio: dict[str, float] = field(default_factory=dict)
    """Share of each decision in the window."""
    reference_decision_ratio: dict[str, float] = field(default_factory=dict)
    """Share of each decision in the version's reference period."""
    live: dict[str, LiveQuality] = field(default_factory=dict)
    """By maturity (``MATURITIES``)."""
    reference_precision: dict[str, Interval] = field(default_factory=dict)
    """The test period's precision by threshold."""
    reference_recall: dict[str, Interval] = field(default_factory=dict)
    retraining_advised: bool | None = None

    @property
    def feature_psi(self) -> list[tuple[str, float]]:
        """Features' PSI, largest first (the score apart)."""
        return sorted(((f, v) for f, v in self.psi.items() if f != "score"), key=lambda fv: -fv[1])


class MonitorSource(Protocol):
    """Live quality and drift per model version."""

    @property
    def where(self) -> str:
        """Where the figures come from."""
        ...

    async def quality(self) -> dict[str, VersionQuality]:
        """Figures by model version (empty when nothing is measured yet); raises
        SourceUnavailable."""
        ...


GAUGES = (
    catalogue.DRIFT_PSI,
    catalogue.FEATURE_MISSING_RATIO,
    catalogue.WINDOW_DECISIONS,
    catalogue.DECISION_RATIO,
    catalogue.REFERENCE_DECISION_RATIO,
    catalogue.LIVE_PRECISION,
    catalogue.LIVE_RECALL,
    catalogue.LIVE_AVERAGE_PRECISION,
    catalogue.LABELLED_RATIO,
    catalogue.LIVE_LABELLED_FRAUDS,
    catalogue.REFERENCE_PRECISION,
    catalogue.REFERENCE_RECALL,
    catalogue.RETRAINING_ADVISED,
)
"""The monitor's per-version gauges the Models page shows."""


def _version(sample: Sample) -> str | None:
    """The sample's model version, or None for a sample without one or without a number
    (the monitor exports NaN where a figure has nothing to stand on)."""
    version = sample.labels.get("model_version")
    return version if version and math.isfinite(sample.value) else None


_KEYED = {
    catalogue.DRIFT_PSI.name: ("psi", "feature"),
    catalogue.FEATURE_MISSING_RATIO.name: ("missing", "feature"),
    catalogue.WINDOW_DECISIONS.name: ("decisions", "arm"),
    catalogue.DECISION_RATIO.name: ("decision_ratio", "decision"),
    catalogue.REFERENCE_DECISION_RATIO.name: ("reference_decision_ratio", "decision"),
}
"""Gauges kept as one mapping per version: gauge → (VersionQuality field, label keyed by)."""
_PER_MATURITY = {
    catalogue.LIVE_AVERAGE_PRECISION.name: "average_precision",
    catalogue.LABELLED_RATIO.name: "labelled_ratio",
    catalogue.LIVE_LABELLED_FRAUDS.name: "frauds",
    catalogue.LIVE_PRECISION.name: "precision",
    catalogue.LIVE_RECALL.name: "recall",
}
"""Gauges by cohort maturity: gauge → LiveQuality field."""
_REFERENCE = {
    catalogue.REFERENCE_PRECISION.name: "reference_precision",
    catalogue.REFERENCE_RECALL.name: "reference_recall",
}
"""Test-period intervals: gauge → VersionQuality field."""


class _Gathered:
    """One version's samples sorted by what they become."""

    def __init__(self) -> None:
        self.flat: dict[str, dict[str, float]] = collections.defaultdict(dict)
        # maturity → figure → value; precision and recall as e.g. "precision:review"
        self.live: dict[str, dict[str, float]] = collections.defaultdict(dict)
        # field → threshold → bound → value
        self.bounds: dict[str, dict[str, dict[str, float]]] = collections.defaultdict(
            lambda: collections.defaultdict(dict)
        )
        self.advised: bool | None = None

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        """Files one sample of gauge ``name``."""
        if name in _KEYED:
            into, label = _KEYED[name]
            self.flat[into][labels.get(label, "?")] = value
        elif name in _PER_MATURITY:
            figure = _PER_MATURITY[name]
            if "threshold" in labels:
                figure += ":" + labels["threshold"]
            self.live[labels.get("maturity", "?")][figure] = value
        elif name in _REFERENCE:
            threshold, bound = labels.get("threshold", "?"), labels.get("bound", "?")
            self.bounds[_REFERENCE[name]][threshold][bound] = value
        elif name == catalogue.RETRAINING_ADVISED.name:
            self.advised = value >= 1

    def _intervals(self, field_name: str) -> dict[str, Interval]:
        return {
            t: Interval(b["low"], b["estimate"], b["high"])
            for t, b in self.bounds.get(field_name, {}).items()
            if {"low", "estimate", "high"} <= set(b)
        }

    @staticmethod
    def _cohort(figures: dict[str, float]) -> LiveQuality:
        def thresholds(kind: str) -> dict[str, float]:
            return {k.split(":", 1)[1]: v for k, v in figures.items() if k.startswith(kind + ":")}

        return LiveQuality(
            precision=thresholds("precision"),
            recall=thresholds("recall"),
            average_precision=figures.get("average_precision"),
            labelled_ratio=figures.get("labelled_ratio"),
            frauds=figures.get("frauds"),
        )

    def quality(self, version: str) -> VersionQuality:
        """The version's figures."""
        f = self.flat
        return VersionQuality(
            version=version,
            psi=dict(f.get("psi", {})),
            missing=dict(f.get("missing", {})),
            decisions=dict(f.get("decisions", {})),
            decision_ratio=dict(f.get("decision_ratio", {})),
            reference_decision_ratio=dict(f.get("reference_decision_ratio", {})),
            live={m: self._cohort(self.live[m]) for m in sorted(self.live, key=_maturity_order)},
            reference_precision=self._intervals("reference_precision"),
            reference_recall=self._intervals("reference_recall"),
            retraining_advised=self.advised,
        )


def build_quality(series: Mapping[str, list[Sample]]) -> dict[str, VersionQuality]:
    """Every version the monitor's gauges name (``series``: samples by gauge name), with its
    figures; a figure without a finite value is left out."""
    gathered: dict[str, _Gathered] = collections.defaultdict(_Gathered)
    for name, samples in series.items():
        for sample in samples:
            if (version := _version(sample)) is not None:
                gathered[version].add(name, sample.labels, sample.value)
    return {v: gathered[v].quality(v) for v in sorted(gathered, key=_version_order)}


def _maturity_order(maturity: str) -> tuple[int, str]:
    """Matured cohorts first, then immature ones, then any other label."""
    known = MATURITIES.index(maturity) if maturity in MATURITIES else len(MATURITIES)
    return (known, maturity)


def _version_order(version: str) -> tuple[int, str]:
    """Numbered versions newest first, then any other name."""
    return (-int(version), "") if version.isdigit() else (1, version)


class PrometheusMonitor:
    """The monitor's gauges as Prometheus holds them (where the console cannot reach the
    monitor itself)."""

    def __init__(self, prometheus: PrometheusSource) -> None:
        self._prometheus = prometheus

    @property
    def where(self) -> str:
        """The Prometheus the gauges are read from."""
        return f"the monitor's gauges in Prometheus ({self._prometheus.where})"

    async def quality(self) -> dict[str, VersionQuality]:
        """Every version any of the gauges names."""
        answers = await asyncio.gather(*(self._prometheus.query(g.name) for g in GAUGES))
        return build_quality({g.name: a for g, a in zip(GAUGES, answers, strict=True)})


def parse_metrics_page(text: str) -> dict[str, list[Sample]]:
    """Samples by name of a Prometheus text exposition; raises SourceUnavailable for a page
    that is not one."""
    series: dict[str, list[Sample]] = collections.defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series[sample.name].append(Sample(dict(sample.labels), float(sample.value)))
    except ValueError as error:
        raise SourceUnavailable(f"the monitor's metrics page did not parse: {error}") from None
    return dict(series)


class MetricsPageMonitor:
    """The monitor's own metrics page (``http://host:port/metrics``): its figures as it holds
    them now, without a scrape in between."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s

    @property
    def where(self) -> str:
        """The page's URL."""
        return f"the monitor's metrics page ({self.url})"

    def _get(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as reply:
                return bytes(reply.read()).decode("utf-8", errors="replace")
        except (OSError, ValueError) as error:
            raise SourceUnavailable(
                f"the monitor at {self.url} is not reachable ({error})"
            ) from None

    async def quality(self) -> dict[str, VersionQuality]:
        """Reads and parses the page off the event loop."""
        text = await asyncio.to_thread(self._get)
        return build_quality(parse_metrics_page(text))


class NoMonitor:
    """Neither the monitor nor a Prometheus configured."""

    where = "no monitor configured (FRAUD_CONSOLE_MONITOR_URL or FRAUD_CONSOLE_PROMETHEUS_URL)"

    async def quality(self) -> dict[str, VersionQuality]:
        """Always unavailable."""
        raise SourceUnavailable(self.where)
