"""The scraper on a real exposition: families shaped like the gateway's, served over HTTP by
the client library, read back by name and labels; histogram quantiles as Prometheus estimates
them."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from services.common import metric_catalogue as catalogue
from services.common import scrape

_Spec = TypeVar("_Spec", bound=catalogue.MetricSpec)


@dataclass
class Families:
    """Families shaped like the gateway's, under names of this test's own: a process that
    imported feast keeps every family's values in shared files keyed by name, so the
    gateway's own names would carry other tests' observations."""

    registry: CollectorRegistry
    decisions: catalogue.CounterSpec
    shed: catalogue.CounterSpec
    latency: catalogue.HistogramSpec
    diff: catalogue.HistogramSpec


@pytest.fixture
def families() -> Families:
    tag = f"scrape_test_{uuid.uuid4().hex[:8]}"
    registry = CollectorRegistry()

    def like(spec: _Spec) -> _Spec:
        return dataclasses.replace(spec, name=spec.name.replace("fraudmesh", tag))

    made = Families(
        registry,
        like(catalogue.DECISIONS),
        like(catalogue.SHED),
        like(catalogue.SCORE_LATENCY),
        like(catalogue.SHADOW_SCORE_DIFF),
    )
    decisions = made.decisions.create(registry)
    decisions.labels("approve", "model", "online").inc(5)
    decisions.labels("review", "model", "default").inc(2)
    decisions.labels("approve", "rules", "default").inc(3)
    made.shed.create(registry)
    latency = made.latency.create(registry)
    for seconds in (0.0005, 0.004, 0.004, 0.012, 1.5):
        latency.observe(seconds)
    diff = made.diff.create(registry)
    for value in (-0.6, 0.0, 0.0, 0.05):
        diff.labels("2").observe(value)
    return made


@pytest.fixture
def served(families: Families) -> Iterator[str]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=families.registry)
    try:
        yield scrape.url("127.0.0.1", server.server_port)
    finally:
        server.shutdown()
        thread.join(5)


def test_fetch_reads_samples_by_name_and_labels(families: Families, served: str) -> None:
    page = scrape.fetch(served)
    decisions = families.decisions
    assert page.sum(decisions) == 10
    assert page.sum(decisions, scored_by="model") == 7
    assert page.get(decisions, decision="approve", scored_by="rules") == 3
    assert page.by_label(decisions, "feature_source") == {"online": 5, "default": 5}
    assert page.by_label(decisions.name, "decision", feature_source="default") == {
        "review": 2,
        "approve": 3,
    }
    # A labelled family before its first observation has no sample: None, or 0 as a sum.
    assert page.get(families.diff.count, model_version="3") is None
    assert page.sum(decisions, decision="decline") == 0.0
    # An unlabelled counter is there from the start.
    assert page.get(families.shed) == 0.0
    assert page.get(families.latency.count) == 5


def test_histogram_buckets_and_quantiles(families: Families) -> None:
    page = scrape.Samples.parse(generate_latest(families.registry).decode())
    buckets = page.buckets(families.latency)
    assert sorted(buckets) == [*catalogue.SCORE_LATENCY.buckets, math.inf]
    assert (buckets[0.001], buckets[0.005], buckets[0.015], buckets[0.25], buckets[math.inf]) == (
        1, 3, 4, 4, 5,
    )  # fmt: skip
    # The median's rank 2.5 lies in (0.0035, 0.004], which holds 2 of the 5 (ranks 2 and 3).
    assert scrape.histogram_quantile(0.5, buckets) == pytest.approx(0.0035 + 0.0005 * 0.75)
    # The top fifth lies in +Inf: the highest finite bound answers.
    assert scrape.histogram_quantile(0.99, buckets) == catalogue.SCORE_LATENCY.buckets[-1]
    diffs = page.buckets(families.diff, model_version="2")
    assert scrape.histogram_quantile(0.1, diffs) == -0.5  # the first bucket, not above 0
    assert scrape.histogram_quantile(0.5, diffs) == pytest.approx(-0.001 + 0.002 * 0.5)


def test_histogram_quantile_by_hand() -> None:
    buckets = {0.1: 10.0, 0.2: 30.0, math.inf: 40.0}
    assert scrape.histogram_quantile(0.1, buckets) == pytest.approx(0.04)
    assert scrape.histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert scrape.histogram_quantile(0.9, buckets) == 0.2
    assert scrape.histogram_quantile(0.0, {-0.5: 5.0, 0.5: 10.0, math.inf: 10.0}) == -0.5
    grown = scrape.increase({0.1: 4.0, 0.2: 10.0, math.inf: 10.0}, buckets)
    assert grown == {0.1: 6.0, 0.2: 20.0, math.inf: 30.0}
    assert math.isnan(scrape.histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}))
    with pytest.raises(ValueError, match="Inf"):
        scrape.histogram_quantile(0.5, {0.1: 1.0})
    with pytest.raises(ValueError, match="within"):
        scrape.histogram_quantile(1.5, buckets)
