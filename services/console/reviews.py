"""The decision log as analysts see it: REVIEW decisions waiting for a verdict, and one
decision looked up by transaction id, each with what the model saw and any outcome.

Reads are bounded. The queue covers the last ``queue_days`` UTC day partitions and keeps
only REVIEW rows; each part is read once (parts are immutable: written under a temporary
name and renamed, replaced only by compaction under a new name), so a page view reads only
the parts that landed since the last one. A lookup reads the transaction id column of one
day's parts at a time, newest day first, and stops at the first day that holds it. Both use
``services.decisionlog.reader``, so events count once, retries keep the first decision and an
outcome is the latest report, exactly as in ``fraudmesh decisions export``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from services.decisionlog import layout, reader
from services.domain import money

DECISION_COLUMNS = (
    "event_id",
    "transaction_id",
    "card_id",
    "merchant_id",
    "terminal_id",
    "amount_minor",
    "currency",
    "card_not_present",
    "transaction_at",
    "decision",
    "score",
    "model_version",
    "scored_by",
    "feature_source",
    "route",
    "shadow_score",
    "shadow_model_version",
    "reasons",
    "elapsed_ms",
    "decided_at",
    "features",
    "feature_names",
    "feature_schema",
)
"""What the console shows of a decision (the log position is left out)."""
OUTCOME_COLUMNS = (
    "event_id",
    "transaction_id",
    "outcome",
    "outcome_source",
    "reported_by",
    "reported_at",
    "received_at",
)
"""What it reads of an outcome."""
SETTLED = frozenset({"fraud", "legitimate"})
"""Outcomes that take a decision out of the queue (a dispute leaves it there)."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Outcome:
    """The latest outcome of a transaction."""

    outcome: str
    source: str
    reported_by: str | None
    reported_at: datetime | None
    received_at: datetime | None
    reports: int


@dataclass(frozen=True)
class LoggedDecision:
    """One decision as the log holds it, with the features the model saw by name."""

    transaction_id: str
    card_id: str
    merchant_id: str
    terminal_id: str | None
    amount_minor: int
    currency: str
    card_not_present: bool
    transaction_at: datetime | None
    decided_at: datetime | None
    decision: str
    score: float
    model_version: str
    scored_by: str
    feature_source: str
    route: str
    reasons: tuple[str, ...]
    features: tuple[tuple[str, float], ...]
    shadow_score: float | None = None
    shadow_model_version: str | None = None
    elapsed_ms: float | None = None
    outcome: Outcome | None = None

    @property
    def amount(self) -> str:
        """The amount in major units with its currency, e.g. ``1,800.00 EUR``."""
        try:
            per_major = money.minor_per_major(self.currency)
        except (KeyError, ValueError):
            return f"{self.amount_minor:,} (minor units) {self.currency}"
        digits = len(str(int(per_major))) - 1
        return f"{self.amount_minor / per_major:,.{digits}f} {self.currency}"


@dataclass(frozen=True)
class QueueFilter:
    """What an analyst narrowed the queue to; empty fields do not filter."""

    card_id: str = ""
    merchant_id: str = ""
    model_version: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def active(self) -> bool:
        """True when any field filters."""
        return any((self.card_id, self.merchant_id, self.model_version, self.since, self.until))


@dataclass(frozen=True)
class QueuePage:
    """One page of the queue, newest decision first."""

    items: list[LoggedDecision]
    waiting: int
    """REVIEW decisions in the window without a verdict (before filtering)."""
    matching: int
    """Of those, how many match the filter."""
    offset: int
    window_start: date
    model_versions: list[str]
    """Versions that made the waiting decisions (for the filter)."""
    truncated: bool = False
    """True when older REVIEW decisions of the window were left out (``max_rows``)."""


@dataclass
class _Chunk:
    day: date
    files: frozenset[Path]
    table: pa.Table


@dataclass
class PartCache:
    """Rows read from parts, kept per day and load, so that each part is read once. A chunk
    whose parts are no longer all listed (compacted, or deleted by retention) is dropped and
    its remaining parts read again; beyond ``max_rows`` the oldest days are dropped for good
    (until they are compacted into new parts)."""

    kind: layout.Kind
    columns: Sequence[str]
    where: pc.Expression | None = None
    max_rows: int | None = None
    chunks: list[_Chunk] = field(default_factory=list)
    skipped: set[Path] = field(default_factory=set)

    def refresh(self, files_by_day: Iterable[tuple[date, list[Path]]]) -> tuple[pa.Table, bool]:
        """The rows of every listed part, and whether some were left out for ``max_rows``."""
        listed = {day: set(files) for day, files in files_by_day}
        every = set().union(*listed.values()) if listed else set()
        self.chunks = [c for c in self.chunks if c.files <= listed.get(c.day, set())]
        self.skipped &= every
        covered = set().union(*(c.files for c in self.chunks)) if self.chunks else set()
        for day in sorted(listed):
            new = sorted(listed[day] - covered - self.skipped)
            if new:
                table = reader.read_parts(new, self.kind, self.columns, self.where)
                self.chunks.append(_Chunk(day, frozenset(new), table))
        self.chunks.sort(key=lambda c: c.day)
        if self.max_rows is not None:
            while len(self.chunks) > 1 and sum(c.table.num_rows for c in self.chunks) > (
                self.max_rows
            ):
                self.skipped |= self.chunks.pop(0).files
        tables = [c.table for c in self.chunks]
        schema = layout.SCHEMAS[self.kind]
        table = (
            pa.concat_tables(tables) if tables else schema.empty_table().select(list(self.columns))
        )
        return table, bool(self.skipped)


def _files_by_day(root: Path, kind: layout.Kind, first: date) -> list[tuple[date, list[Path]]]:
    return [(day, layout.parts(d)) for day, d in layout.day_dirs(root, kind) if day >= first]


def _timestamp(value: object) -> datetime | None:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(int(value) / 1_000_000, UTC)  # type: ignore[call-overload]


def _outcome(latest: pd.DataFrame, transaction_id: str) -> Outcome | None:
    if transaction_id not in latest.index:
        return None
    row = latest.loc[transaction_id]
    by = row["outcome_reported_by"]
    return Outcome(
        outcome=str(row["outcome"]),
        source=str(row["outcome_source"]),
        reported_by=None if by is None or pd.isna(by) else str(by),
        reported_at=_timestamp(row["outcome_reported_at"]),
        received_at=_timestamp(row["outcome_received_at"]),
        reports=int(row["outcome_reports"]),
    )


def decisions_of(table: pa.Table, latest: pd.DataFrame | None = None) -> list[LoggedDecision]:
    """The rows of ``table`` (``DECISION_COLUMNS``) as decisions, with features by name and
    each transaction's outcome from ``latest`` (``reader.latest_outcomes``)."""
    orders = reader.feature_orders(table)
    out = []
    for row in table.to_pylist():
        values = row.get("features") or []
        names = orders.get(row.get("feature_schema") or "") or tuple(row.get("feature_names") or ())
        if len(names) != len(values):
            names = tuple(f"feature {i}" for i in range(len(values)))
        out.append(
            LoggedDecision(
                transaction_id=row["transaction_id"],
                card_id=row["card_id"] or "",
                merchant_id=row["merchant_id"] or "",
                terminal_id=row["terminal_id"],
                amount_minor=int(row["amount_minor"] or 0),
                currency=row["currency"] or "",
                card_not_present=bool(row["card_not_present"]),
                transaction_at=_timestamp(row["transaction_at"]),
                decided_at=_timestamp(row["decided_at"]),
                decision=row["decision"] or "",
                score=float(row["score"] or 0.0),
                model_version=row["model_version"] or "",
                scored_by=row["scored_by"] or "",
                feature_source=row["feature_source"] or "",
                route=row["route"] or "",
                reasons=tuple(row["reasons"] or ()),
                features=tuple(zip(names, (float(v) for v in values), strict=True)),
                shadow_score=row.get("shadow_score"),
                shadow_model_version=row.get("shadow_model_version"),
                elapsed_ms=row.get("elapsed_ms"),
                outcome=_outcome(latest, row["transaction_id"]) if latest is not None else None,
            )
        )
    return out


def _matches(table: pa.Table, f: QueueFilter) -> pa.Table:
    mask = pa.array([True] * table.num_rows, pa.bool_())
    for column, value in (
        ("card_id", f.card_id),
        ("merchant_id", f.merchant_id),
        ("model_version", f.model_version),
    ):
        if value:
            mask = pc.and_(mask, pc.equal(table.column(column), value))
    at = table.column("decided_at")
    if f.since is not None:
        mask = pc.and_(mask, pc.greater_equal(at, pa.scalar(f.since, layout.TIMESTAMP)))
    if f.until is not None:
        mask = pc.and_(mask, pc.less(at, pa.scalar(f.until, layout.TIMESTAMP)))
    return table.filter(pc.fill_null(mask, False))


class DecisionLogView:
    """The review queue and lookups over one decision log folder (thread-safe)."""

    def __init__(
        self,
        root: Path,
        *,
        queue_days: int = 7,
        max_rows: int = 100_000,
        lookup_days: int = 90,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.root = root
        self.queue_days = queue_days
        self.lookup_days = lookup_days
        self._clock = clock
        self._lock = threading.Lock()
        self._reviews = PartCache(
            "decisions",
            DECISION_COLUMNS,
            where=pc.field("decision") == "review",
            max_rows=max_rows,
        )
        self._outcomes = PartCache("outcomes", OUTCOME_COLUMNS)

    def _window_start(self) -> date:
        return self._clock().date() - timedelta(days=self.queue_days - 1)

    def queue(
        self,
        where: QueueFilter = QueueFilter(),
        offset: int = 0,
        limit: int = 50,
        judged: Collection[str] = (),
    ) -> QueuePage:
        """REVIEW decisions of the window with no settled outcome (and not in ``judged``,
        verdicts given meanwhile), newest first, filtered, one page."""
        start = self._window_start()
        with self._lock:
            reviews, truncated = self._reviews.refresh(_files_by_day(self.root, "decisions", start))
            # An outcome lands in the partition of the day it was received: never before its
            # decision's day, but allow one day for clocks that disagree around midnight.
            outcomes, _ = self._outcomes.refresh(
                _files_by_day(self.root, "outcomes", start - timedelta(days=1))
            )
        reviews, _, _ = reader.first_decisions(reviews)
        latest = reader.latest_outcomes(reader.unique_events(outcomes))
        settled = set(latest.index[latest["outcome"].isin(SETTLED)]) | set(judged)
        if settled:
            keep = pc.invert(pc.is_in(reviews.column("transaction_id"), pa.array(list(settled))))
            reviews = reviews.filter(keep)
        versions = sorted(set(reviews.column("model_version").drop_null().to_pylist()))
        matching = _matches(reviews, where)
        order = pc.sort_indices(
            matching, sort_keys=[("decided_at", "descending"), ("transaction_id", "ascending")]
        )
        page = matching.take(order).slice(offset, limit)
        return QueuePage(
            items=decisions_of(page, latest),
            waiting=reviews.num_rows,
            matching=matching.num_rows,
            offset=offset,
            window_start=start,
            model_versions=versions,
            truncated=truncated,
        )

    def lookup(self, transaction_id: str) -> LoggedDecision | None:
        """The transaction's decision (its first) with its latest outcome, or None when the
        last ``lookup_days`` days of the log do not hold it."""
        first = self._clock().date() - timedelta(days=self.lookup_days - 1)
        days = [(d, p) for d, p in layout.day_dirs(self.root, "decisions") if d >= first]
        same = pc.field("transaction_id") == transaction_id
        for day, folder in reversed(days):
            found = reader.read_parts(layout.parts(folder), "decisions", DECISION_COLUMNS, same)
            if found.num_rows:
                decision, _, _ = reader.first_decisions(found)
                outcomes = reader.read_table(
                    self.root,
                    "outcomes",
                    first_day=day - timedelta(days=1),
                    columns=OUTCOME_COLUMNS,
                    where=same,
                )
                latest = reader.latest_outcomes(reader.unique_events(outcomes))
                return decisions_of(decision, latest)[0]
        return None
