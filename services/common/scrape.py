"""Reads a process's Prometheus ``/metrics`` page: fetch it, parse it with the client
library's parser, and ask it for the figures benchmarks and tests need (a sample's value,
sums over labels, histogram buckets and a quantile estimated from them)."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.common.metric_catalogue import HistogramSpec, MetricSpec

Metric = MetricSpec | str
"""A catalogue entry (its queried name is used) or a sample name."""


def url(host: str, port: int) -> str:
    """The ``/metrics`` URL of a process's metrics port."""
    return f"http://{host}:{port}/metrics"


def _name(metric: Metric) -> str:
    return metric if isinstance(metric, str) else metric.name


class Samples:
    """The samples of one ``/metrics`` page."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.samples = tuple(samples)

    @classmethod
    def parse(cls, text: str) -> Samples:
        """The samples of a page in the Prometheus text format."""
        return cls(s for family in text_string_to_metric_families(text) for s in family.samples)

    def matching(self, metric: Metric, **labels: str) -> list[Sample]:
        """The samples called ``metric`` whose labels include ``labels``."""
        name = _name(metric)
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def get(self, metric: Metric, **labels: str) -> float | None:
        """The sum of the matching samples (the one value when ``labels`` name them all);
        None when no sample matches (a labelled family before its first observation)."""
        found = self.matching(metric, **labels)
        return sum(s.value for s in found) if found else None

    def sum(self, metric: Metric, **labels: str) -> float:
        """The sum of the matching samples; 0 when none matches."""
        return sum(s.value for s in self.matching(metric, **labels))

    def by_label(self, metric: Metric, label: str, **labels: str) -> dict[str, float]:
        """The matching samples summed by the value of ``label`` ("" where it is absent)."""
        out: dict[str, float] = {}
        for s in self.matching(metric, **labels):
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
        return out

    def buckets(self, histogram: HistogramSpec | str, **labels: str) -> dict[float, float]:
        """A histogram's cumulative buckets (upper bound → count, +Inf included), summed
        over the labels not given."""
        name = histogram.bucket if isinstance(histogram, HistogramSpec) else f"{histogram}_bucket"
        return {float(le): count for le, count in self.by_label(name, "le", **labels).items()}


def fetch(metrics_url: str, timeout_s: float = 5.0) -> Samples:
    """The samples ``metrics_url`` serves now."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as reply:
        return Samples.parse(reply.read().decode())


def increase(before: Mapping[float, float], after: Mapping[float, float]) -> dict[float, float]:
    """What cumulative buckets gained between two scrapes (bounds of ``after``)."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """The ``q``-quantile (0..1) estimated from cumulative buckets as Prometheus's
    ``histogram_quantile`` does: linear inside the bucket that holds the rank, from 0 for the
    first bucket (its upper bound when that is not above 0), the highest finite bound when
    the rank falls in +Inf. NaN without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is within [0, 1], not {q}")
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        raise ValueError("cumulative buckets end with +Inf")
    total = buckets[math.inf]
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for i, bound in enumerate(bounds):
        cumulative = buckets[bound]
        if cumulative >= rank:
            if bound == math.inf:
                return lower if i else math.nan
            if i == 0 and bound <= 0:
                return bound
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower
