"""The monitor's state in memory: events applied to slices and cohorts, the queries the
gauges, the report and a rollout controller ask, and checkpoints to the state file.

Decisions are counted once per transaction (the first one consumed; a retried Score call or a
redelivered event is skipped by the decision index), into the slice of the time they were
decided, per model version and arm (live, canary; a shadow version's score of the same
payment into the shadow arm), and into their version's cohort of that hour. An outcome is
counted against its decision's cohort; a later outcome of the same transaction replaces it
(the latest reported wins, as in ``fraudmesh decisions export``); an outcome that comes
before its decision waits in the state file until the decision does.

Thread-safe: one lock guards every change and query (the consume loop applies, the exporter
and a rollout controller read).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from fraud.v1 import events_pb2, outcomes_pb2
from fraud.v1 import scoring_pb2 as pb
from services.domain import featurespec
from services.eventlog import Record
from services.eventlog.events import feature_schema_id
from services.monitor import evaluation, tally
from services.monitor.evaluation import HOUR_US, Cohort, Figures
from services.monitor.references import ReferenceBook
from services.monitor.rulewatch import (
    RuleKey,
    RuleView,
    RuleWatch,
    decode_rules,
    encode_rules,
    fired_rules,
)
from services.monitor.state import Decided, MonitorStore, Outcome, transaction_key
from services.monitor.tally import Layout, Scored, Tally

log = logging.getLogger(__name__)

_DECISION = {pb.DECISION_APPROVE: 0, pb.DECISION_REVIEW: 1, pb.DECISION_DECLINE: 2}
_SOURCE = {pb.FEATURE_SOURCE_ONLINE: 0, pb.FEATURE_SOURCE_PARTIAL: 1, pb.FEATURE_SOURCE_DEFAULT: 2}
_ARM = {events_pb2.ROUTE_CANARY: "canary"}
_LABEL = {
    outcomes_pb2.OUTCOME_FRAUD: evaluation.LABELS.index("fraud"),
    outcomes_pb2.OUTCOME_LEGITIMATE: evaluation.LABELS.index("legitimate"),
}
_DISPUTED = evaluation.LABELS.index("disputed")
_RULE_WATCH = "rule_watch"
"""The meta key of the rules' counts (``RuleWatch.encode``)."""
_ENGINE = {
    pb.SCORED_BY_FIRST_STAGE: tally.FIRST_STAGE,
    pb.SCORED_BY_SMALL_MODEL: tally.SMALL_MODEL,
    pb.SCORED_BY_RULES: tally.RULES,
}
"""Who answered, by ``scored_by`` (anything else: the full model)."""
_MODEL_ORDER = featurespec.MODEL_FEATURES
_US = 1_000_000


@dataclass(frozen=True)
class MonitorPolicy:
    """How long the monitor keeps what, and how much it needs before it judges."""

    slice_s: int = 60
    """Width of a time slice; windows are whole slices."""
    window_s: int = 86_400
    """The rolling window the drift gauges are computed over: a whole day, because the
    traffic of one hour is far from the day's (night payments score higher: docs/monitoring.md)
    and the reference is a whole period's."""
    retention_s: int = 26 * 3600
    """Slices kept (queryable by a rollout controller) after they start; at least a window."""
    min_decisions: int = 500
    """Fewest decisions in a window for a PSI: with fewer, sampling alone moves it past 0.1."""
    label_delay_s: float = 7 * 86_400.0
    """A decision without an outcome counts as genuine once this old (retraining's rule)."""
    evaluation_days: int = 28
    """Matured cohorts of this many days (after the label delay) make the live figures."""
    index_days: int = 9
    """Decisions are remembered this long for the outcomes that come later (an outcome for
    an older decision is counted as unmatched)."""


@dataclass
class ApplyStats:
    """What one ``apply`` did, by kind (the metrics' figures)."""

    decisions: int = 0
    duplicates: int = 0
    outcomes: int = 0
    unmatched: int = 0
    """Outcomes whose decision is not known (yet): held until it comes."""
    invalid: int = 0
    newest_us: int = 0
    """Decision time of the newest event applied (0: none)."""


@dataclass
class _Pending:
    """What was applied since the last checkpoint."""

    decided: dict[int, Decided] = field(default_factory=dict)
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    slices: set[tuple[str, str, int]] = field(default_factory=set)
    cohorts: set[tuple[str, int]] = field(default_factory=set)
    fired: dict[int, tuple[int, tuple[RuleKey, ...]]] = field(default_factory=dict)
    """Decision hour and rules of the new decisions a fraud team's rule fired on."""
    events: int = 0


@dataclass(frozen=True)
class _Decision:
    """A decision event as the engine counts it."""

    key: int
    version: str
    arm: str
    slice_start: int
    hour: int
    decision: int
    score: float
    rules: bool
    engine: int
    source: int
    latency_ms: float
    event: events_pb2.DecisionEvent


class MonitorEngine:
    """Slices, cohorts and the decision index of the traffic seen, with their checkpoints."""

    def __init__(
        self, store: MonitorStore, book: ReferenceBook, policy: MonitorPolicy | None = None
    ) -> None:
        self.store = store
        self.book = book
        self.policy = policy or MonitorPolicy()
        self.lock = threading.RLock()
        self.slices: dict[tuple[str, str, int], Tally] = {}
        self.cohorts: dict[tuple[str, int], Cohort] = {}
        self._hours: dict[tuple[str, str, int], Tally] = {}
        """Sums of the slices of past hours, by version, arm and hour."""
        self._pending = _Pending()
        self.rules = RuleWatch()
        """The fraud team's rules: fire counts and labels per rule and hour."""
        self._load()

    def _load(self) -> None:
        """Reads the slices and cohorts of the last checkpoint."""
        now_s = int(time.time())
        for version, arm, start, data in self.store.slices(now_s - self.policy.retention_s):
            self.slices[(version, arm, start)] = Tally.decode(data)
        since_hour = now_s // 3600 - self._cohort_hours()
        for version, hour, data in self.store.cohorts(since_hour):
            self.cohorts[(version, hour)] = Cohort.decode(data)
        self.rules = RuleWatch.decode(self.store.meta(_RULE_WATCH))
        if self.slices or self.cohorts:
            log.info(
                "monitor state restored",
                extra={"slices": len(self.slices), "cohorts": len(self.cohorts)},
            )

    def _cohort_hours(self) -> int:
        p = self.policy
        return math.ceil(p.label_delay_s / 3600) + 24 * p.evaluation_days + 1

    @property
    def uncheckpointed(self) -> int:
        """Events applied since the last checkpoint."""
        return self._pending.events

    # -- applying events ----------------------------------------------------------------------

    def apply(self, records: Sequence[Record]) -> ApplyStats:
        """Counts a poll's records (decisions first, so an outcome finds a decision polled
        with it)."""
        stats = ApplyStats()
        decisions: list[events_pb2.DecisionEvent] = []
        outcomes: list[events_pb2.OutcomeEvent] = []
        for record in records:
            try:
                envelope = record.envelope()
            except DecodeError:
                stats.invalid += 1
                continue
            kind = envelope.WhichOneof("event")
            if kind == "decision":
                decisions.append(envelope.decision)
            elif kind == "outcome":
                outcomes.append(envelope.outcome)
            elif kind == "list_change":
                continue  # the lists' audit: nothing the monitor counts
            else:
                stats.invalid += 1
        with self.lock:
            if decisions:
                self._decisions(decisions, stats)
            if outcomes:
                self._outcomes(outcomes, stats)
            self._pending.events += len(records)
        return stats

    def _decisions(self, events: list[events_pb2.DecisionEvent], stats: ApplyStats) -> None:
        parsed: dict[int, _Decision] = {}
        slice_s = self.policy.slice_s
        now_us = time.time_ns() // 1000
        for event in events:
            decision = _DECISION.get(event.decision)
            if decision is None or not event.transaction_id:
                stats.invalid += 1
                continue
            key = transaction_key(event.transaction_id)
            if key in parsed:
                stats.duplicates += 1
                continue
            at = event.decided_at
            decided_us = at.seconds * _US + at.nanos // 1000 if at.seconds else now_us
            stats.newest_us = max(stats.newest_us, decided_us)
            parsed[key] = _Decision(
                key=key,
                version=event.model_version,
                arm=_ARM.get(event.route, "live"),
                slice_start=(decided_us // _US) // slice_s * slice_s,
                hour=decided_us // HOUR_US,
                decision=decision,
                score=min(max(event.score, 0.0), 1.0),
                rules=event.scored_by == pb.SCORED_BY_RULES,
                engine=_ENGINE.get(event.scored_by, tally.MODEL),
                source=_SOURCE.get(event.feature_source, 0),
                latency_ms=event.elapsed_ms,
                event=event,
            )
        pending = self._pending.decided
        for key in [k for k in parsed if k in pending]:
            del parsed[key]
            stats.duplicates += 1
        for key in self.store.decided([k for k in parsed]):
            del parsed[key]
            stats.duplicates += 1
        if not parsed:
            return
        fresh = list(parsed.values())
        stats.decisions += len(fresh)
        self._count_slices(fresh)
        held = {**self.store.outcomes([d.key for d in fresh])}
        held.update({k: o for k, o in self._pending.outcomes.items() if k in parsed})
        grid = tally.grid_bins(np.asarray([d.score for d in fresh]))
        for d, grid_bin in zip(fresh, grid.tolist(), strict=True):
            index = Decided(d.version, d.hour, d.decision, grid_bin)
            pending[d.key] = index
            cohort = self._cohort(d.version, d.hour)
            cohort.decided(d.decision, grid_bin)
            rules = self._rules_decided(d)
            outcome = held.get(d.key)
            if outcome is not None and outcome.hour is None:
                cohort.labelled(outcome.label, d.decision, grid_bin)
                self.rules.labelled(d.hour, rules, evaluation.LABELS[outcome.label])
                self._pending.outcomes[d.key] = Outcome(
                    outcome.label, outcome.reported_us, outcome.received_us, d.hour
                )

    def _rules_decided(self, d: _Decision) -> tuple[RuleKey, ...]:
        """Counts the decision for the fraud team's rules; the rules that fired on it."""
        rules = fired_rules(d.event)
        self.rules.decided(d.hour, rules)
        if rules:
            self._pending.fired[d.key] = (d.hour, rules)
        return rules

    def _fired(self, keys: list[int]) -> dict[int, tuple[int, tuple[RuleKey, ...]]]:
        """The hour and rules of the decisions of ``keys`` a fraud team's rule fired on."""
        found = {k: (h, decode_rules(r)) for k, (h, r) in self.store.fired(keys).items()}
        found.update({k: self._pending.fired[k] for k in keys if k in self._pending.fired})
        return found

    def _cohort(self, version: str, hour: int) -> Cohort:
        key = (version, hour)
        cohort = self.cohorts.get(key)
        if cohort is None:
            cohort = self.cohorts[key] = Cohort()
        self._pending.cohorts.add(key)
        return cohort

    def _tally(self, version: str, arm: str, start: int, layout: Layout) -> Tally:
        key = (version, arm, start)
        found = self.slices.get(key)
        if found is None or not layout.fits(found):
            found = self.slices[key] = layout.empty()
        self._pending.slices.add(key)
        self._hours.pop((version, arm, start // 3600), None)
        return found

    def _count_slices(self, fresh: list[_Decision]) -> None:
        groups: dict[tuple[str, str, int], list[_Decision]] = {}
        for d in fresh:
            groups.setdefault((d.version, d.arm, d.slice_start), []).append(d)
        for (version, arm, start), members in groups.items():
            layout = self.book.get(version).layout
            batch = Scored(
                scores=np.asarray([d.score for d in members]),
                decisions=np.asarray([d.decision for d in members]),
                rules=np.asarray([d.rules for d in members]),
                engines=np.asarray([d.engine for d in members], dtype=np.int64),
                sources=np.asarray([d.source for d in members]),
                latency_ms=np.asarray([d.latency_ms for d in members]),
                features=self._features(layout, [d.event for d in members]),
            )
            tally.count(layout, batch, self._tally(version, arm, start, layout))
        self._count_shadows(fresh)
        self._count_canary_failures(fresh)

    def _count_canary_failures(self, fresh: list[_Decision]) -> None:
        """Cards a canary could not answer, against the canary (its error and timeout rates);
        the answer itself was counted as the version that gave it."""
        groups: dict[tuple[str, int], list[_Decision]] = {}
        for d in fresh:
            if d.event.canary_failed_version:
                groups.setdefault((d.event.canary_failed_version, d.slice_start), []).append(d)
        for (version, start), members in groups.items():
            layout = self.book.get(version).layout
            into = self._tally(version, "canary", start, layout)
            into.failed += len(members)
            into.timed_out += sum(1 for d in members if d.event.canary_timed_out)

    def _count_shadows(self, fresh: list[_Decision]) -> None:
        groups: dict[tuple[str, int], list[_Decision]] = {}
        for d in fresh:
            if d.event.shadow_model_version and d.event.HasField("shadow_score"):
                groups.setdefault((d.event.shadow_model_version, d.slice_start), []).append(d)
        for (version, start), members in groups.items():
            known = self.book.get(version)
            if known.metadata is None:
                continue
            t = known.metadata.thresholds
            scores = np.clip(np.asarray([d.event.shadow_score for d in members]), 0.0, 1.0)
            decisions = np.where(scores >= t.decline, 2, np.where(scores >= t.review, 1, 0))
            batch = Scored(
                scores=scores,
                decisions=decisions,
                rules=np.zeros(len(members), dtype=bool),
                sources=np.asarray([d.source for d in members]),
                latency_ms=np.zeros(0),
                answered=np.asarray([d.decision for d in members]),
            )
            tally.count(known.layout, batch, self._tally(version, "shadow", start, known.layout))

    def _features(
        self, layout: Layout, events: list[events_pb2.DecisionEvent]
    ) -> np.ndarray | None:
        """The events' features in the layout's order, NaN where missing (events of an
        unknown feature order or without a vector are left out as a whole batch's rows)."""
        if layout.reference is None:
            return None
        rows: list[list[float]] = []
        for event in events:
            order = _order_of(event, self.book.orders)
            if order is None or len(event.features) != len(order):
                continue
            values = list(event.features)
            for i in event.missing_features:
                if i < len(values):
                    values[i] = math.nan
            if order != layout.features:
                named = dict(zip(order, values, strict=True))
                values = [named.get(name, math.nan) for name in layout.features]
            rows.append(values)
        if not rows:
            return None
        return np.asarray(rows, dtype=np.float64)

    def _outcomes(self, events: list[events_pb2.OutcomeEvent], stats: ApplyStats) -> None:
        latest: dict[int, Outcome] = {}
        for event in events:
            if not event.transaction_id:
                stats.invalid += 1
                continue
            key = transaction_key(event.transaction_id)
            outcome = Outcome(
                _LABEL.get(event.outcome, _DISPUTED),
                event.reported_at.seconds * _US + event.reported_at.nanos // 1000,
                event.received_at.seconds * _US + event.received_at.nanos // 1000,
                None,
            )
            stats.outcomes += 1
            before = latest.get(key)
            if before is None or not before.newer_than(outcome):
                latest[key] = outcome
        if not latest:
            return
        stored = self.store.outcomes(list(latest))
        stored.update({k: o for k, o in self._pending.outcomes.items() if k in latest})
        unknown = [k for k in latest if k not in self._pending.decided]
        decided = {**self.store.decided(unknown)}
        decided.update({k: self._pending.decided[k] for k in latest if k in self._pending.decided})
        fired = self._fired(list(latest))
        for key, outcome in latest.items():
            before = stored.get(key)
            if before is not None and not outcome.newer_than(before):
                continue
            index = decided.get(key)
            if index is None:
                stats.unmatched += 1
                self._pending.outcomes[key] = outcome
                continue
            cohort = self._cohort(index.version, index.hour)
            rules = fired.get(key, (index.hour, ()))[1]
            if before is not None and before.hour is not None:
                cohort.labelled(before.label, index.decision, index.bin, -1)
                self.rules.labelled(index.hour, rules, evaluation.LABELS[before.label], -1)
            cohort.labelled(outcome.label, index.decision, index.bin)
            self.rules.labelled(index.hour, rules, evaluation.LABELS[outcome.label])
            self._pending.outcomes[key] = Outcome(
                outcome.label, outcome.reported_us, outcome.received_us, index.hour
            )

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoint(self) -> int:
        """Writes what changed since the last checkpoint; returns how many events it covers."""
        with self.lock:
            p = self._pending
            self.store.save(
                p.decided.items(),
                p.outcomes.items(),
                [
                    (v, a, s, self.slices[(v, a, s)].encode())
                    for v, a, s in p.slices
                    if (v, a, s) in self.slices
                ],
                [
                    (v, h, self.cohorts[(v, h)].encode())
                    for v, h in p.cohorts
                    if (v, h) in self.cohorts
                ],
                {"checkpoint_at": str(time.time()), _RULE_WATCH: self.rules.encode()},
                [(k, h, encode_rules(r)) for k, (h, r) in p.fired.items()],
            )
            covered = p.events
            self._pending = _Pending()
            return covered

    def prune(self, now_s: float | None = None) -> None:
        """Forgets slices, cohorts and index rows past their horizons (memory and file)."""
        now = int(now_s if now_s is not None else time.time())
        p = self.policy
        slices_before = now - p.retention_s - p.slice_s
        cohorts_before = now // 3600 - self._cohort_hours()
        index_before = now // 3600 - 24 * p.index_days
        with self.lock:
            for key in [k for k in self.slices if k[2] < slices_before]:
                del self.slices[key]
            for key in [k for k in self._hours if (k[2] + 1) * 3600 < slices_before]:
                del self._hours[key]
            for hour_key in [k for k in self.cohorts if k[1] < cohorts_before]:
                del self.cohorts[hour_key]
            self.rules.prune(cohorts_before)
            self.store.prune(
                slices_before, cohorts_before, index_before, (now - 86_400 * p.index_days) * _US
            )

    # -- queries ------------------------------------------------------------------------------

    def versions(self, since_s: float, arms: Sequence[str] = tally.ARMS) -> set[str]:
        """Versions with traffic in one of ``arms`` since ``since_s``."""
        with self.lock:
            return {
                v for v, a, s in self.slices if s >= since_s - self.policy.slice_s and a in arms
            }

    def window(
        self,
        version: str,
        arms: Sequence[str] = ("live", "canary"),
        since_s: float | None = None,
        until_s: float | None = None,
    ) -> Tally:
        """The sum of the version's slices in ``arms`` that start in [since, until) (default:
        the rolling window up to now)."""
        now = time.time()
        since = now - self.policy.window_s if since_s is None else since_s
        until = math.inf if until_s is None else until_s
        out = Tally()
        with self.lock:
            by_hour: dict[tuple[str, int], list[Tally]] = {}
            for (v, a, s), t in self.slices.items():
                if v == version and a in arms and since <= s < until:
                    by_hour.setdefault((a, s // 3600), []).append(t)
            for (arm, hour), members in by_hour.items():
                start, end = hour * 3600, (hour + 1) * 3600
                # A past hour wholly inside the window is summed once and kept (counting
                # into one of its slices drops the sum).
                if since <= start and end <= min(until, now - self.policy.slice_s):
                    key = (version, arm, hour)
                    whole = self._hours.get(key)
                    if whole is None:
                        whole = self._hours[key] = tally.merged(members)
                    out.add(whole)
                else:
                    for member in members:
                        out.add(member)
        return out

    def layout(self, version: str) -> Layout:
        """The version's layout (its reference's bins)."""
        return self.book.get(version).layout

    def evaluation(self, version: str, now_s: float | None = None) -> dict[str, Figures]:
        """The version's live figures, ``matured`` and ``immature`` (see ``evaluation``)."""
        now_us = int((now_s if now_s is not None else time.time()) * _US)
        delay_us = int(self.policy.label_delay_s * _US)
        first_hour = now_us // HOUR_US - self._cohort_hours()
        matured, immature = Cohort(), Cohort()
        with self.lock:
            for (v, hour), cohort in self.cohorts.items():
                if v != version or hour < first_hour:
                    continue
                is_matured = evaluation.matured(hour, now_us, delay_us)
                (matured if is_matured else immature).add(cohort)
        return {
            "matured": evaluation.figures(matured, True),
            "immature": evaluation.figures(immature, False),
        }

    def rule_views(self, now_s: float | None = None) -> list[RuleView]:
        """Each fraud team's rule's fire rate over the rolling window and its precision over
        the decisions of the evaluation's horizon."""
        now = time.time() if now_s is None else now_s
        since_hour = int(now - self.policy.window_s) // 3600
        with self.lock:
            return self.rules.views(since_hour, int(now) // 3600 - self._cohort_hours())

    def evaluated_versions(self) -> set[str]:
        """Versions with cohorts."""
        with self.lock:
            return {v for v, _ in self.cohorts}


def _order_of(
    event: events_pb2.DecisionEvent, known: dict[str, tuple[str, ...]]
) -> tuple[str, ...] | None:
    """The event's feature order: its names, a known schema's, or the model's own."""
    if event.feature_names:
        return tuple(event.feature_names)
    if event.feature_schema in known:
        return known[event.feature_schema]
    if event.feature_schema == _MODEL_SCHEMA:
        return _MODEL_ORDER
    return None


_MODEL_SCHEMA = feature_schema_id(_MODEL_ORDER)
