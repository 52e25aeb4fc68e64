"""Prometheus metrics of the feature service: the age of the rows each lookup used."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from services.common import metric_catalogue as catalogue


class FeatureMetrics:
    """The feature service's metric families (declared in the catalogue)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.row_age = catalogue.FEATURE_ROW_AGE.create(registry)
        self.empty = catalogue.FEATURE_LOOKUPS_EMPTY.create(registry)


_metrics: FeatureMetrics | None = None


def feature_metrics() -> FeatureMetrics:
    """This process's feature-service metrics, created on first use."""
    global _metrics
    if _metrics is None:
        _metrics = FeatureMetrics()
    return _metrics
