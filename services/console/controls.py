"""The fraud team's controls as the console shows and changes them: the policy's versions
(live, candidate, previous, rolled back) with their rules and per-merchant thresholds, and the
block and allow lists with their entries.

Every change goes through the functions the ``fraudmesh rules`` and ``fraudmesh lists``
commands use (``PolicyStore.promote`` / ``rollback``, ``add_entry``, ``ListStore.remove``), so
an entry added here is checked, stored and followed by the gateways exactly as one added at
the command line (docs/controls.md). Everything here blocks on files or the online store:
the pages call it on a worker thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from fraud.v1 import events_pb2
from services.common.errors import FraudmeshError, InvalidArgument
from services.domain import backtest as backtest_domain
from services.domain import policy as policy_domain
from services.domain.lists import ListEntry, ListKind, ListName, parse_kind, parse_list
from services.eventlog import EventLogError, EventLogSettings, audit
from services.featurestore.lists import ListStore, add_entry, open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.models.policies import PolicyChange, PolicyStore

SHOWN_VALUES = 6
"""Values of a long membership condition shown before ``(+N more)``."""
MAX_FIELD_CHARS = 1024
"""Longest text a list form's field may carry; the entry's own checks are tighter."""
BACKTEST_DAYS = 30
"""The backtest page's window by default: the payments decided in the last this many days."""
MAX_BACKTEST_DAYS = 366
MAX_POLICY_CHARS = 60_000
"""Longest policy the Rules page publishes (the console takes no body over 64 KiB; a larger
policy goes through ``fraudmesh rules publish``)."""
_OPERATORS = (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<="), ("eq", "="))


class ControlsUnavailable(FraudmeshError):
    """The online store or the policy folder cannot be read or written now."""

    code = "UNAVAILABLE"


# -- the policy ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleView:
    """One rule as the page shows it."""

    name: str
    action: str
    priority: int
    mode: str
    scope: str
    conditions: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ThresholdView:
    """One per-merchant thresholds entry."""

    merchants: tuple[str, ...]
    review: float
    decline: float


@dataclass(frozen=True)
class VersionRow:
    """A published policy version and where it stands."""

    version: str
    state: str
    """``live``, ``previous`` (a rollback target), ``rolled back`` or ``candidate``."""
    live_rules: int
    shadow_rules: int


@dataclass(frozen=True)
class RulesView:
    """What the Rules page shows: one version (the live one by default) and the history."""

    live: str | None
    shown: str | None
    description: str = ""
    rules: tuple[RuleView, ...] = ()
    thresholds: tuple[ThresholdView, ...] = ()
    versions: tuple[VersionRow, ...] = ()
    history: tuple[PolicyChange, ...] = ()
    rollback_to: str | None = None
    """The version a rollback makes live ("" for no policy); None: nothing to roll back to."""
    problem: str | None = None


def _values(name: str, values: list[str]) -> str:
    shown = ", ".join(values[:SHOWN_VALUES])
    more = len(values) - SHOWN_VALUES
    return f"{name} in {shown}" + (f" (+{more} more)" if more > 0 else "")


def _bounds(name: str, compare: policy_domain.Compare) -> str:
    parts = [
        f"{symbol} {getattr(compare, key):g}"
        for key, symbol in _OPERATORS
        if getattr(compare, key) is not None
    ]
    return f"{name} " + " and ".join(parts)


def describe_when(when: policy_domain.When) -> tuple[str, ...]:
    """A rule's conditions in words, one per condition (all must hold)."""
    out: list[str] = []
    if when.channel is not None:
        out.append(f"channel = {when.channel}")
    if when.amount_eur is not None:
        out.append(_bounds("amount_eur", when.amount_eur))
    for name in ("currency", "merchant", "terminal", "card_prefix"):
        values = getattr(when, name)
        if values is not None:
            out.append(_values(name, list(values)))
    for feature, compare in sorted((when.features or {}).items()):
        out.append(_bounds(f"feature {feature}", compare))
    return tuple(out) or ("always",)


def _scoped(entry: policy_domain.Scope | policy_domain.MerchantThresholds) -> tuple[str, ...]:
    """The merchants an entry names, then its merchant categories as ``category <MCC>``."""
    return (*(entry.merchants or ()), *(f"category {c}" for c in entry.categories or ()))


def _rule_view(rule: policy_domain.RuleSpec) -> RuleView:
    scope = _values("merchants", list(_scoped(rule.scope))) if rule.scope else "all merchants"
    return RuleView(
        name=rule.name,
        action=rule.action.value,
        priority=rule.priority,
        mode=rule.mode.value,
        scope=scope,
        conditions=describe_when(rule.when),
        reason=rule.reason or f"{rule.action.value} by rule {rule.name}",
    )


def rolled_back(history: list[PolicyChange]) -> set[str]:
    """Versions that were live and left by a rollback, replaying the history."""
    live: str | None = None
    left: set[str] = set()
    for change in history:
        if change.action == "promote":
            live = change.version
        elif change.action == "rollback":
            if live is not None:
                left.add(live)
            live = change.version
    return left


# -- the lists -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EntriesFilter:
    """Which entries the Lists page shows."""

    list: ListName | None = None
    kind: ListKind | None = None
    value: str = ""
    """Entries whose value contains this text."""

    def matches(self, entry: ListEntry) -> bool:
        """Whether ``entry`` passes the filter."""
        return (
            (self.list is None or entry.list is self.list)
            and (self.kind is None or entry.kind is self.kind)
            and self.value in entry.value
        )


@dataclass(frozen=True)
class EntriesPage:
    """One page of entries, newest first."""

    generation: int
    total: int
    matching: int
    items: list[ListEntry] = field(default_factory=list)


@dataclass(frozen=True)
class NewEntry:
    """An entry to add, as the form gave it (checked again when added)."""

    kind: ListKind
    value: str
    list: ListName
    reason: str
    expires_at_s: float | None


def form_text(
    form: Mapping[str, object], name: str, required: bool = True, max_chars: int = MAX_FIELD_CHARS
) -> str:
    """A form field's text; InvalidArgument naming it when missing, not text (a file) or
    longer than ``max_chars``."""
    value = form.get(name)
    if value is None or value == "":
        if required:
            raise InvalidArgument(name, "is required")
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(name, "must be text")
    if len(value) > max_chars:
        raise InvalidArgument(name, f"is longer than {max_chars} characters")
    return value.strip()


def parse_expiry(text: str) -> float | None:
    """Epoch seconds of an expiry typed as ``YYYY-MM-DDTHH:MM`` (UTC unless it says); None
    for none."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            "expires", f"{text[:32]!r} is not a time (YYYY-MM-DDTHH:MM, UTC)"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def parse_entry_form(form: Mapping[str, object]) -> NewEntry:
    """The entry a form asks to add; InvalidArgument naming the first wrong field."""
    return NewEntry(
        kind=parse_kind(form_text(form, "kind")),
        value=form_text(form, "value"),
        list=parse_list(form_text(form, "list")),
        reason=form_text(form, "reason"),
        expires_at_s=parse_expiry(form_text(form, "expires", required=False)),
    )


def parse_entry_key(form: Mapping[str, object]) -> tuple[ListName, ListKind, str]:
    """The entry a form asks to remove; InvalidArgument naming the first wrong field."""
    name = parse_list(form_text(form, "list"))
    return name, parse_kind(form_text(form, "kind")), form_text(form, "value")


# -- both, over the stores -----------------------------------------------------------------


class Controls:
    """The policy folder and the lists in the online store, as the console reaches them."""

    def __init__(
        self,
        policy: PolicyStore,
        store_settings: FeatureStoreSettings,
        eventlog: EventLogSettings | None = None,
        decisions_root: Path | None = None,
    ) -> None:
        self.policy = policy
        self.store_settings = store_settings
        # The decision log a backtest replays; None: backtests are not offered.
        self.decisions_root = decisions_root
        # Where list changes are audited, as `fraudmesh lists` audits them; None: not at all
        # (a console without the mesh's event log).
        self.eventlog = eventlog

    def rules(self, version: str | None = None) -> RulesView:
        """The Rules page's facts: ``version`` (default: the live one) and every version."""
        state = self.policy.read_state()
        shown = version or state.live
        left = rolled_back(state.history)
        rows = tuple(
            VersionRow(
                r.version,
                "rolled back" if r.state == "candidate" and r.version in left else r.state,
                r.rules,
                r.shadow,
            )
            for r in self.policy.listing()
        )
        view = RulesView(
            live=state.live,
            shown=shown,
            versions=rows,
            history=tuple(reversed(state.history[-20:])),
            rollback_to=(state.previous[-1] or "") if state.previous else None,
        )
        if shown is None:
            return view
        try:
            spec = policy_domain.parse(self.policy.text(shown))
        except policy_domain.PolicyError as error:
            return replace(view, problem=f"policy version {shown} does not check: {error}")
        ordered = sorted(spec.rules, key=lambda r: -r.priority)  # stable: then as written
        return replace(
            view,
            description=spec.description,
            rules=tuple(_rule_view(r) for r in ordered),
            thresholds=tuple(
                ThresholdView(_scoped(t), t.review, t.decline) for t in spec.thresholds
            ),
        )

    def publish(self, text: str, actor: str) -> str:
        """Checks a policy's text and stores it as the next version, a candidate
        (``fraudmesh rules publish``); returns the version. ``PolicyError`` naming the rule
        and the field when it does not check: nothing is written."""
        return self.policy.publish(text, actor)

    def backtest(self, version: str, days: int, now: datetime) -> backtest_domain.BacktestReport:
        """What published ``version`` would have done to the payments decided in the ``days``
        before ``now``, by their outcomes, as ``fraudmesh rules backtest VERSION --since``
        computes it: ``NotFound`` for an unknown version, ``FailedPrecondition`` when the log
        holds no decision or no outcome in that window."""
        if self.decisions_root is None:
            raise ControlsUnavailable("this console reads no decision log")
        # Imported on the first backtest (in a worker thread): the log's reader brings pandas
        # and Arrow datasets, two seconds of CPU at every console start otherwise.
        from services.decisionlog import payments

        policy = policy_domain.load(self.policy.text(version), version)
        rows, _ = payments.from_log(self.decisions_root, since=now - timedelta(days=days))
        return backtest_domain.backtest(policy, rows)

    def promote(self, version: str, actor: str) -> str | None:
        """Makes ``version`` live (``fraudmesh rules promote``); the version now live."""
        return self.policy.promote(version, actor).live

    def rollback(self, actor: str) -> str | None:
        """Makes live what was live before (``fraudmesh rules rollback``); the version now
        live (None: no policy)."""
        return self.policy.rollback(actor).live

    @contextmanager
    def _lists(self, reader: bool) -> Iterator[ListStore | None]:
        try:
            store = open_lists(self.store_settings, reader=reader)
        except (OSError, sqlite3.Error, redis.RedisError) as error:
            raise ControlsUnavailable(
                f"cannot open the lists in the online store: {error}"
            ) from None
        try:
            yield store
        except (sqlite3.Error, redis.RedisError) as error:
            raise ControlsUnavailable(f"the online store failed: {error}") from None
        finally:
            if store is not None:
                store.close()

    def entries(self, where: EntriesFilter, offset: int, limit: int) -> EntriesPage:
        """A page of the entries passing ``where``, newest first."""
        with self._lists(reader=True) as store:
            generation, entries = store.entries() if store is not None else (0, [])
        entries.sort(key=lambda e: (-e.added_at_s, e.list.value, e.kind.value, e.value))
        matching = [e for e in entries if where.matches(e)]
        return EntriesPage(generation, len(entries), len(matching), matching[offset:][:limit])

    def add(self, new: NewEntry, actor: str, now_s: float) -> bool:
        """Puts ``new`` on its list as ``fraudmesh lists add`` does (InvalidArgument naming
        the field when wrong); False when the same entry was there already."""
        with self._lists(reader=False) as store:
            assert store is not None
            changed = add_entry(
                store, new.kind, new.value, new.list, new.reason, new.expires_at_s, actor, now_s
            )
            generation = store.generation() if changed else 0
        if changed:
            self._audit(
                audit.list_change(
                    "add",
                    new.list.value,
                    new.kind.value,
                    new.value,
                    reason=new.reason,
                    expires_at_s=new.expires_at_s,
                    actor=actor,
                    generation=generation,
                    changed_at_s=now_s,
                )
            )
        return changed

    def remove(self, name: ListName, kind: ListKind, value: str, actor: str = "") -> bool:
        """Takes an entry off its list; False when it was not there."""
        with self._lists(reader=False) as store:
            assert store is not None
            gone = store.remove(name, kind, value)
            generation = store.generation() if gone else 0
        if gone:
            self._audit(
                audit.list_change(
                    "remove", name.value, kind.value, value, actor=actor, generation=generation
                )
            )
        return gone

    def _audit(self, envelope: events_pb2.EventEnvelope) -> None:
        """Writes a change's audit record on the event log; the change is made either way."""
        if self.eventlog is None:
            return
        try:
            audit.write(self.eventlog, envelope)
        except (EventLogError, OSError) as error:
            raise ControlsUnavailable(
                f"the change is made, but its audit record is not on the event log: {error}"
            ) from None
