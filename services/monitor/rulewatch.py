"""The fraud team's rules as the monitor sees them: each rule's fire rate, live and in shadow,
and its precision as outcomes arrive.

A decision event names the rules that fired on it: the live rule that decided the answer (a
``policy-<version>`` answer whose first reason is ``rule <name>: …``) and every shadow rule
in ``DecisionEvent.shadow_rules`` (``name=action``). ``RuleWatch`` counts, per rule (name,
mode, action) and decision hour, the decisions it fired on and, of those, the ones later
labelled fraud or legitimate; and every decision per hour, the fire rate's denominator. The
rules of each decision a rule fired on are kept (in the monitor's store, by transaction key)
so that an outcome arriving days later is counted against them, and a changed outcome moves
its count. Pure Python; the engine applies events and checkpoints it with its own state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fraud.v1 import events_pb2
from fraud.v1 import scoring_pb2 as pb

RuleKey = tuple[str, str, str]
"""(rule name, mode ``live`` or ``shadow``, action)."""

FIRES, FRAUDS, GOODS = range(3)
_ACTIONS = {
    pb.DECISION_APPROVE: "approve",
    pb.DECISION_REVIEW: "review",
    pb.DECISION_DECLINE: "decline",
}


def rules_fired(
    by_rules: bool,
    model_version: str,
    reasons: Sequence[str],
    decision: str,
    shadow_rules: Iterable[str],
) -> tuple[RuleKey, ...]:
    """The rules that fired on a decision: the live rule that decided it (an answer of the
    rules engine by a ``policy-`` version, first reason ``rule <name>: …``), then its shadow
    rules (``name=action``)."""
    found: list[RuleKey] = []
    if (
        by_rules
        and model_version.startswith("policy-")
        and reasons
        and reasons[0].startswith("rule ")
    ):
        found.append((reasons[0].removeprefix("rule ").split(":", 1)[0], "live", decision))
    for entry in shadow_rules:
        name, _, action = entry.partition("=")
        if name:
            found.append((name, "shadow", action))
    return tuple(found)


def fired_rules(event: events_pb2.DecisionEvent) -> tuple[RuleKey, ...]:
    """The rules that fired on a decision event (``rules_fired``)."""
    return rules_fired(
        event.scored_by == pb.SCORED_BY_RULES,
        event.model_version,
        event.reasons,
        _ACTIONS.get(event.decision, "unspecified"),
        event.shadow_rules,
    )


def encode_rules(rules: Sequence[RuleKey]) -> str:
    """The rules of one decision as stored text."""
    return json.dumps([list(r) for r in rules])


def decode_rules(text: str) -> tuple[RuleKey, ...]:
    """The rules of one decision from stored text."""
    return tuple((str(n), str(m), str(a)) for n, m, a in json.loads(text))


@dataclass(frozen=True)
class RuleView:
    """One rule's figures over a window."""

    name: str
    mode: str
    action: str
    fires: int
    fire_ratio: float
    """Fires over every decision in the window (NaN without decisions)."""
    frauds: int
    goods: int
    precision: float
    """Frauds over labelled fires (NaN without any)."""


class RuleWatch:
    """Counts per rule and decision hour, and decisions per hour."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, int], list[int]] = {}
        self.decisions: dict[int, int] = {}

    def decided(self, hour: int, rules: Iterable[RuleKey]) -> None:
        """Counts one decision of ``hour`` and the rules that fired on it."""
        self.decisions[hour] = self.decisions.get(hour, 0) + 1
        for name, mode, action in rules:
            self._row(name, mode, action, hour)[FIRES] += 1

    def labelled(self, hour: int, rules: Iterable[RuleKey], label: str, delta: int = 1) -> None:
        """Counts (or with ``delta`` -1 uncounts) a ``fraud`` or ``legitimate`` outcome of a
        decision of ``hour`` against its rules."""
        column = {"fraud": FRAUDS, "legitimate": GOODS}.get(label)
        if column is None:
            return
        for name, mode, action in rules:
            self._row(name, mode, action, hour)[column] += delta

    def _row(self, name: str, mode: str, action: str, hour: int) -> list[int]:
        key = (name, mode, action, hour)
        row = self.counts.get(key)
        if row is None:
            row = self.counts[key] = [0, 0, 0]
        return row

    def views(self, since_hour: int, labelled_since_hour: int) -> list[RuleView]:
        """Each rule's fire rate since ``since_hour`` and precision since
        ``labelled_since_hour``, by mode then name."""
        decisions = sum(n for h, n in self.decisions.items() if h >= since_hour)
        fires: dict[RuleKey, int] = {}
        labels: dict[RuleKey, list[int]] = {}
        for (name, mode, action, hour), row in self.counts.items():
            key = (name, mode, action)
            if hour >= since_hour:
                fires[key] = fires.get(key, 0) + row[FIRES]
            if hour >= labelled_since_hour:
                held = labels.setdefault(key, [0, 0])
                held[0] += row[FRAUDS]
                held[1] += row[GOODS]
        views = []
        for key in sorted(set(fires) | set(labels), key=lambda k: (k[1], k[0], k[2])):
            frauds, goods = labels.get(key, [0, 0])
            n = fires.get(key, 0)
            views.append(
                RuleView(
                    *key,
                    fires=n,
                    fire_ratio=n / decisions if decisions else float("nan"),
                    frauds=frauds,
                    goods=goods,
                    precision=frauds / (frauds + goods) if frauds + goods else float("nan"),
                )
            )
        return views

    def prune(self, before_hour: int) -> None:
        """Forgets hours before ``before_hour``."""
        self.counts = {k: v for k, v in self.counts.items() if k[3] >= before_hour}
        self.decisions = {h: n for h, n in self.decisions.items() if h >= before_hour}

    def encode(self) -> str:
        """The counts as text, for the checkpoint."""
        return json.dumps(
            {
                "counts": [[*k, *v] for k, v in self.counts.items()],
                "decisions": [[h, n] for h, n in self.decisions.items()],
            }
        )

    @classmethod
    def decode(cls, text: str | None) -> RuleWatch:
        """The counts of a checkpoint (empty for None)."""
        watch = cls()
        if not text:
            return watch
        data: Mapping[str, list[list[object]]] = json.loads(text)
        for name, mode, action, hour, fires, frauds, goods in data.get("counts", []):
            watch.counts[(str(name), str(mode), str(action), int(str(hour)))] = [
                int(str(fires)),
                int(str(frauds)),
                int(str(goods)),
            ]
        for hour, n in data.get("decisions", []):
            watch.decisions[int(str(hour))] = int(str(n))
        return watch
