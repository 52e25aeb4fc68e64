"""The metric catalogue is the whole truth: every family the services create is declared in it
exactly as created, every declaration is created (or provided by the client library), and no
metric name is written anywhere else in the product."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from services.common import metric_catalogue as catalogue
from services.common.rpc_observer import ServerMetrics
from services.decisionlog.metrics import SinkMetrics
from services.eventlog.metrics import EventLogMetrics
from services.features.metrics import FeatureMetrics
from services.gateway.metrics import GatewayMetrics
from services.monitor.metrics import MonitorMetrics
from services.updater.metrics import UpdaterMetrics

SERVICES = Path(catalogue.__file__).resolve().parents[1]
EXPORTERS = {
    "gateway": GatewayMetrics,
    "eventlog": EventLogMetrics,
    "decisionlog": SinkMetrics,
    "updater": UpdaterMetrics,
    "features": FeatureMetrics,
    "server": ServerMetrics,
    "monitor": MonitorMetrics,
}


def _created(component: str) -> dict[str, MetricWrapperBase]:
    """The families one exporter's metrics class creates, by the name they are queried by."""
    holder = EXPORTERS[component](CollectorRegistry())
    families = [v for v in vars(holder).values() if isinstance(v, MetricWrapperBase)]
    return {f"{f._name}_total" if f._type == "counter" else f._name: f for f in families}


def test_names_are_unique_and_follow_the_conventions() -> None:
    names = [spec.name for spec in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for spec in catalogue.CATALOGUE:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", spec.name), spec.name
        assert spec.help.strip() and all(re.fullmatch(r"[a-z_]+", label) for label in spec.labels)
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        own = not isinstance(spec, catalogue.ProvidedSpec)
        assert spec.name.startswith("fraudmesh_") == own, spec.name
        if isinstance(spec, catalogue.HistogramSpec):
            assert list(spec.buckets) == sorted(set(spec.buckets)), spec.name
            assert spec.bucket == f"{spec.name}_bucket"


@pytest.mark.parametrize("component", sorted(EXPORTERS))
def test_each_exporter_creates_exactly_its_declared_families(component: str) -> None:
    created = _created(component)
    declared = {spec.name: spec for spec in catalogue.of_component(component)}
    assert sorted(created) == sorted(declared)
    for name, family in created.items():
        spec = declared[name]
        assert (family._type, family._documentation) == (spec.kind, spec.help), name
        assert tuple(family._labelnames) == spec.labels, name
        if isinstance(spec, catalogue.HistogramSpec):
            assert tuple(family._upper_bounds) == (*spec.buckets, float("inf")), name


def test_provided_metrics_are_the_client_librarys_defaults() -> None:
    exposed = {family.name: family for family in REGISTRY.collect()}
    for spec in catalogue.of_component("process"):
        family = exposed[spec.family]
        assert (family.type, family.documentation) == (spec.kind, spec.help), spec.name
        assert all(set(s.labels) == set(spec.labels) for s in family.samples), spec.name


def test_lookup_by_name_and_family() -> None:
    assert catalogue.by_name("fraudmesh_decisions_total") is catalogue.DECISIONS
    assert catalogue.by_name("fraudmesh_decisions") is catalogue.DECISIONS
    assert catalogue.DECISIONS.family == "fraudmesh_decisions"
    assert catalogue.SCORE_LATENCY.family == catalogue.SCORE_LATENCY.name
    with pytest.raises(KeyError, match="no metric"):
        catalogue.by_name("fraudmesh_nothing")


def test_no_metric_name_is_written_outside_the_catalogue() -> None:
    declared = {spec.name for spec in catalogue.CATALOGUE} | {
        spec.family for spec in catalogue.CATALOGUE
    }
    written = []
    for path in sorted(SERVICES.rglob("*.py")):
        if path.name == "metric_catalogue.py":
            continue
        strings = (
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
        written += [
            f"{path.relative_to(SERVICES)}: {text}"
            for text in strings
            if text in declared or text.startswith("fraudmesh_")
        ]
    assert written == []


def test_latency_buckets_step_as_the_docs_say() -> None:
    """docs/observability.md: at most 25 % a step from 1 to 50 ms, 42 ms a bound."""
    bounds = catalogue.LATENCY_BUCKETS
    steps = [(a, b) for a, b in itertools.pairwise(bounds) if 0.001 <= a < 0.05]
    assert steps and all(b / a <= 1.25 + 1e-9 for a, b in steps), steps
    assert 0.042 in bounds and len(bounds) == 34
