"""The rules fallback: a deterministic engine over the model's features, read from a file.

Each rule is a conjunction of feature comparisons with a weight; the weights of the rules
that fire combine as independent evidence, score = 1 - prod(1 - weight). The engine
answers when the model cannot, and its fired rules also explain model answers.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.common.errors import FailedPrecondition

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}

DEFAULT_RULES = Path(__file__).with_name("rules.yaml")


@dataclass(frozen=True, slots=True)
class Condition:
    """``feature op value``."""

    feature: str
    op: Callable[[float, float], bool]
    value: float


@dataclass(frozen=True, slots=True)
class Rule:
    """A named conjunction of conditions, its weight and its human-readable reason."""

    name: str
    reason: str
    weight: float
    conditions: tuple[Condition, ...]

    def fires(self, features: Mapping[str, float]) -> bool:
        """True when every condition holds."""
        return all(c.op(features[c.feature], c.value) for c in self.conditions)


@dataclass(frozen=True, slots=True)
class RulesVerdict:
    """What the rules say about one transaction."""

    score: float
    fired: tuple[Rule, ...]

    def reasons(self, features: Mapping[str, float]) -> list[str]:
        """Reasons of the fired rules, heaviest first, with feature values filled in."""
        ordered = sorted(self.fired, key=lambda r: r.weight, reverse=True)
        return [r.reason.format_map(features) for r in ordered]


class RulesEngine:
    """Evaluates a rule set loaded from YAML."""

    def __init__(self, version: str, review: float, decline: float, rules: Sequence[Rule]) -> None:
        self.version = version
        self.review = review
        self.decline = decline
        self.rules = tuple(rules)

    @classmethod
    def load(cls, path: Path, known_features: Sequence[str]) -> RulesEngine:
        """Reads and checks a rules file; every feature it names must be a model feature."""
        try:
            doc = yaml.safe_load(path.read_text())
            known = set(known_features)
            rules = []
            for item in doc["rules"]:
                conditions = []
                for feature, op, value in item["when"]:
                    if feature not in known:
                        raise ValueError(f"rule {item['name']!r}: unknown feature {feature!r}")
                    if op not in _OPS:
                        raise ValueError(f"rule {item['name']!r}: unknown operator {op!r}")
                    conditions.append(Condition(feature, _OPS[op], float(value)))
                weight = float(item["weight"])
                if not 0.0 < weight < 1.0:
                    raise ValueError(f"rule {item['name']!r}: weight must be in (0, 1)")
                rules.append(Rule(item["name"], item["reason"], weight, tuple(conditions)))
            thresholds = doc["thresholds"]
            return cls(
                str(doc["version"]),
                float(thresholds["review"]),
                float(thresholds["decline"]),
                rules,
            )
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as error:
            raise FailedPrecondition(f"rules file {path}: {error}") from error

    def evaluate(self, features: Mapping[str, float]) -> RulesVerdict:
        """Scores ``features`` (model feature name → value)."""
        fired = tuple(r for r in self.rules if r.fires(features))
        clean = 1.0
        for rule in fired:
            clean *= 1.0 - rule.weight
        return RulesVerdict(1.0 - clean, fired)
