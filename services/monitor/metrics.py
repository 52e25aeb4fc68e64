"""Prometheus metrics of the monitor: its own health, and each version's figures from a
snapshot (label sets of versions no longer seen are removed)."""

from __future__ import annotations

import math

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from services.common import metric_catalogue as catalogue
from services.monitor.evaluation import THRESHOLDS
from services.monitor.snapshot import Snapshot
from services.monitor.tally import DECISIONS

_BOUNDS = ("low", "estimate", "high")


class MonitorMetrics:
    """The monitor's metric families (declared in the catalogue; on the default registry
    unless told otherwise)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.drift_psi = catalogue.DRIFT_PSI.create(registry)
        self.missing_ratio = catalogue.FEATURE_MISSING_RATIO.create(registry)
        self.reference_missing = catalogue.REFERENCE_MISSING_RATIO.create(registry)
        self.decision_ratio = catalogue.DECISION_RATIO.create(registry)
        self.reference_decision_ratio = catalogue.REFERENCE_DECISION_RATIO.create(registry)
        self.window_decisions = catalogue.WINDOW_DECISIONS.create(registry)
        self.live_precision = catalogue.LIVE_PRECISION.create(registry)
        self.live_recall = catalogue.LIVE_RECALL.create(registry)
        self.live_ap = catalogue.LIVE_AVERAGE_PRECISION.create(registry)
        self.labelled_ratio = catalogue.LABELLED_RATIO.create(registry)
        self.labelled_frauds = catalogue.LIVE_LABELLED_FRAUDS.create(registry)
        self.rule_fires = catalogue.RULE_FIRES.create(registry)
        self.rule_fire_ratio = catalogue.RULE_FIRE_RATIO.create(registry)
        self.rule_precision = catalogue.RULE_PRECISION.create(registry)
        self.reference_precision = catalogue.REFERENCE_PRECISION.create(registry)
        self.reference_recall = catalogue.REFERENCE_RECALL.create(registry)
        self.advised = catalogue.RETRAINING_ADVISED.create(registry)
        self.advice = catalogue.RETRAINING_ADVICE.create(registry)
        self.events = catalogue.MONITOR_EVENTS.create(registry)
        self.lag = catalogue.MONITOR_LAG.create(registry)
        self.errors = catalogue.MONITOR_ERRORS.create(registry)
        self.checkpoint = catalogue.MONITOR_CHECKPOINT.create(registry)
        self.ready = catalogue.MONITOR_READY.create(registry)
        self._published: dict[Gauge, set[tuple[str, ...]]] = {}

    def publish(self, snapshot: Snapshot, advised: set[str]) -> None:
        """Sets every version gauge from ``snapshot``; ``advised`` are the versions under a
        retraining advice."""
        seen: dict[Gauge, set[tuple[str, ...]]] = {}

        def put(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
            gauge.labels(*labels).set(value)
            seen.setdefault(gauge, set()).add(labels)

        for version, view in snapshot.versions.items():
            for arm, n in view.window_decisions.items():
                put(self.window_decisions, (version, arm), n)
            drift = view.drift
            if drift.decisions:
                for decision, value in view.decision_ratio.items():
                    put(self.decision_ratio, (version, decision), value)
            if drift.decisions and view.reference is not None:
                put(self.drift_psi, (version, "score"), drift.score_psi)
                for feature, value in drift.feature_psi.items():
                    put(self.drift_psi, (version, feature), value)
                for feature, value in drift.missing_ratio.items():
                    put(self.missing_ratio, (version, feature), value)
            reference = view.reference
            if reference is not None:
                for feature, value in drift.reference_missing.items():
                    put(self.reference_missing, (version, feature), value)
                for decision in DECISIONS:
                    put(
                        self.reference_decision_ratio,
                        (version, decision),
                        reference.decision_rates.get(decision, math.nan),
                    )
                quality = reference.quality
                if quality is not None:
                    for threshold in THRESHOLDS:
                        for gauge, intervals in (
                            (self.reference_precision, quality.precision),
                            (self.reference_recall, quality.recall),
                        ):
                            interval = intervals[threshold]
                            for bound, value in zip(
                                _BOUNDS,
                                (interval.low, interval.estimate, interval.high),
                                strict=True,
                            ):
                                put(gauge, (version, threshold, bound), value)
            for maturity, figures in view.live.items():
                if figures.decisions == 0:
                    continue
                for threshold in THRESHOLDS:
                    put(
                        self.live_precision,
                        (version, threshold, maturity),
                        figures.precision[threshold].estimate,
                    )
                    put(
                        self.live_recall,
                        (version, threshold, maturity),
                        figures.recall[threshold].estimate,
                    )
                put(self.live_ap, (version, maturity), figures.average_precision)
                put(self.labelled_ratio, (version, maturity), figures.labelled_ratio)
                put(self.labelled_frauds, (version, maturity), figures.frauds)
            put(self.advised, (version,), 1.0 if version in advised else 0.0)
        for rule in snapshot.rules:
            rule_labels = (rule.name, rule.mode, rule.action)
            put(self.rule_fires, rule_labels, rule.fires)
            put(self.rule_fire_ratio, rule_labels, rule.fire_ratio)
            put(self.rule_precision, rule_labels, rule.precision)
        for gauge, labels in self._published.items():
            for gone in labels - seen.get(gauge, set()):
                gauge.remove(*gone)
        self._published = seen
