"""Where the Overview and the Models page get what is measured elsewhere: a small client of
Prometheus' HTTP query API, and the monitor's figures read through it.

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
from dataclasses import dataclass, field
from typing import Protocol

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
class VersionQuality:
    """What the monitor measures of one model version on live traffic."""

    version: str
    psi: dict[str, float] = field(default_factory=dict)
    """Population stability index by feature ("score" for the score) against the version's
    reference."""
    precision: dict[str, float] = field(default_factory=dict)
    """Live precision by threshold (review, decline) on matured labels."""
    recall: dict[str, float] = field(default_factory=dict)
    """Live recall by threshold."""
    average_precision: float | None = None
    labelled_ratio: float | None = None


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


def _version(sample: Sample) -> str | None:
    """The sample's model version, or None for a sample without one or without a number."""
    version = sample.labels.get("model_version")
    return version if version and math.isfinite(sample.value) else None


class PrometheusMonitor:
    """The monitor's gauges as Prometheus holds them."""

    def __init__(self, prometheus: PrometheusSource) -> None:
        self._prometheus = prometheus

    @property
    def where(self) -> str:
        """The Prometheus the gauges are read from."""
        return self._prometheus.where

    async def quality(self) -> dict[str, VersionQuality]:
        """Every version any of the gauges names."""
        names = (
            catalogue.DRIFT_PSI.name,
            catalogue.LIVE_PRECISION.name,
            catalogue.LIVE_RECALL.name,
            catalogue.LIVE_AVERAGE_PRECISION.name,
            catalogue.LABELLED_RATIO.name,
        )
        answers = await asyncio.gather(*(self._prometheus.query(n) for n in names))
        psi_s, precision_s, recall_s, average_s, labelled_s = answers
        psi: dict[str, dict[str, float]] = collections.defaultdict(dict)
        precision: dict[str, dict[str, float]] = collections.defaultdict(dict)
        recall: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for samples, into, label in (
            (psi_s, psi, "feature"),
            (precision_s, precision, "threshold"),
            (recall_s, recall, "threshold"),
        ):
            for sample in samples:
                if (version := _version(sample)) is not None:
                    into[version][sample.labels.get(label, "?")] = sample.value
        average = {v: s.value for s in average_s if (v := _version(s)) is not None}
        labelled = {v: s.value for s in labelled_s if (v := _version(s)) is not None}
        versions = set(psi) | set(precision) | set(recall) | set(average) | set(labelled)
        return {
            v: VersionQuality(
                version=v,
                psi=dict(psi.get(v, {})),
                precision=dict(precision.get(v, {})),
                recall=dict(recall.get(v, {})),
                average_precision=average.get(v),
                labelled_ratio=labelled.get(v),
            )
            for v in sorted(versions)
        }
