"""The fraud team's policy: rules written as data (YAML), checked, compiled and evaluated.

A policy is a list of named rules. Each rule has conditions over the payment (amount in
EUR, currency, channel, merchant, terminal, card prefix) and over the features the gateway
computes, an action (decline, review, approve), a priority, a scope (every merchant or
some) and a mode (live or shadow). The text is read with YAML's safe loader, bounded in
size, depth and aliases, then checked by pydantic models that forbid unknown fields; a bad
policy raises one ``PolicyError`` naming the rule and the field. A valid one compiles to
plain predicates, so evaluating a payment does no parsing and no I/O (docs/controls.md).
"""

from __future__ import annotations

import enum
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from services.domain import featurespec, money

MAX_POLICY_BYTES = 256 * 1024
"""Largest policy text accepted: a few thousand rules; more is a mistake or an attack."""
MAX_DEPTH = 8
"""Deepest nesting of YAML collections a policy may have (the format needs five)."""
MAX_RULES = 1000
"""Most rules one policy may hold."""
MAX_VALUES = 10_000
"""Most values one membership condition may list."""
FORMAT = 1
"""The policy format this code reads (the document's ``format``)."""

_RULE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_TEXT = Annotated[str, Field(min_length=1, max_length=128)]


class PolicyError(ValueError):
    """A policy that cannot be used: ``rule`` and ``field`` say where (empty when the whole
    document is wrong)."""

    def __init__(self, rule: str, field: str, problem: str) -> None:
        where = f"rule {rule!r}, field {field!r}" if rule else f"field {field!r}"
        super().__init__(f"{where}: {problem}" if field else problem)
        self.rule = rule
        self.field = field
        self.problem = problem


class Action(enum.Enum):
    """What a rule does when it fires."""

    DECLINE = "decline"
    REVIEW = "review"
    APPROVE = "approve"


class Mode(enum.Enum):
    """Whether a rule acts (live) or is only recorded (shadow)."""

    LIVE = "live"
    SHADOW = "shadow"


ACTION_SCORE: dict[Action, float] = {Action.DECLINE: 1.0, Action.REVIEW: 0.5, Action.APPROVE: 0.0}
"""The score answered with a rule's decision (the rule, not a model, decided)."""

_Number = StrictFloat | StrictInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Compare(_Strict):
    """Bounds on a number: every bound given must hold."""

    gt: _Number | None = None
    gte: _Number | None = None
    lt: _Number | None = None
    lte: _Number | None = None
    eq: _Number | None = None


class When(_Strict):
    """A rule's conditions; every condition given must hold (an empty ``when`` always fires)."""

    amount_eur: Compare | None = None
    currency: list[Annotated[str, Field(pattern=r"^[A-Z]{3}$")]] | None = Field(
        None, max_length=MAX_VALUES
    )
    channel: Literal["card_present", "card_not_present"] | None = None
    merchant: list[_TEXT] | None = Field(None, max_length=MAX_VALUES)
    terminal: list[_TEXT] | None = Field(None, max_length=MAX_VALUES)
    card_prefix: list[Annotated[str, Field(min_length=1, max_length=19)]] | None = Field(
        None, max_length=MAX_VALUES
    )
    features: dict[str, Compare] | None = Field(None, max_length=64)


_MCC = Annotated[int, Field(ge=0, le=9999, strict=True)]
"""A merchant category code (ISO 18245), as the store keeps it in ``merchant_category``."""

CATEGORY_FEATURE = "merchant_category"
"""The feature that gives a call's merchant category (the store's, by merchant)."""


class _ByMerchant(_Strict):
    """Merchants listed, merchant categories listed, or both (a merchant in either)."""

    merchants: list[_TEXT] | None = Field(None, min_length=1, max_length=MAX_VALUES)
    categories: list[_MCC] | None = Field(None, min_length=1, max_length=MAX_VALUES)

    @model_validator(mode="after")
    def _one_at_least(self) -> Self:
        if self.merchants is None and self.categories is None:
            raise ValueError("name merchants, categories or both")
        return self


class Scope(_ByMerchant):
    """Where a rule applies: the merchants and merchant categories listed (every merchant
    when absent)."""


class RuleSpec(_Strict):
    """One rule as written."""

    name: Annotated[str, Field(pattern=_RULE_NAME)]
    action: Action
    reason: Annotated[str, Field(max_length=200)] = ""
    priority: StrictInt = Field(0, ge=-1_000_000, le=1_000_000)
    mode: Mode = Mode.LIVE
    scope: Scope | None = None
    when: When = When()


_Probability = Annotated[float, Field(ge=0.0, le=1.0, strict=True)]


class MerchantThresholds(_ByMerchant):
    """Review and decline thresholds of the model's score for some merchants or merchant
    categories (a merchant's own entry wins over its category's)."""

    review: _Probability
    decline: _Probability


class PolicySpec(_Strict):
    """A policy document as written."""

    format: Literal[1] = 1
    """The format version (``FORMAT``); a later format gets a new number."""
    description: Annotated[str, Field(max_length=500)] = ""
    rules: list[RuleSpec] = Field(default_factory=list, max_length=MAX_RULES)
    thresholds: list[MerchantThresholds] = Field(default_factory=list, max_length=MAX_RULES)


@dataclass(frozen=True, slots=True)
class Payment:
    """What a rule sees of a payment: request fields in plain values."""

    card_id: str
    merchant_id: str
    terminal_id: str
    amount_eur: float
    currency: str
    card_not_present: bool


def payment_of(
    card_id: str,
    merchant_id: str,
    terminal_id: str,
    amount_minor: int,
    currency: str,
    card_not_present: bool,
) -> Payment:
    """What a rule sees of a payment given by its request fields (the gateway's controls and
    the backtest build it here, so both see the same amount in EUR)."""
    return Payment(
        card_id,
        merchant_id,
        terminal_id,
        money.amount_eur(amount_minor, currency),
        currency,
        card_not_present,
    )


Check = Callable[[Payment, Mapping[str, float]], bool]

_BOUNDS: dict[str, Callable[[float, float], bool]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
    "eq": operator.eq,
}


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A checked rule, ready to evaluate: its conditions as predicates."""

    name: str
    action: Action
    reason: str
    priority: int
    mode: Mode
    checks: tuple[Check, ...]
    uses_features: bool
    rank: int = 0
    """Place in the order rules are asked (priority, then the order written)."""
    merchants: frozenset[str] | None = None
    """The rule's scope; None: every merchant."""

    def fires(self, payment: Payment, features: Mapping[str, float]) -> bool:
        """True when every condition holds for ``payment`` and ``features`` (the scope is
        the index's to apply)."""
        # A plain loop: all() over a generator costs a frame per call on the request path.
        for check in self.checks:  # noqa: SIM110
            if not check(payment, features):
                return False
        return True


def _first(
    rules: tuple[CompiledRule, ...], payment: Payment, features: Mapping[str, float]
) -> CompiledRule | None:
    for rule in rules:
        if rule.fires(payment, features):
            return rule
    return None


@dataclass(frozen=True, slots=True)
class RuleIndex:
    """Rules of one mode by scope: a call asks its merchant's rules and the rules of every
    merchant, never another merchant's."""

    everywhere: tuple[CompiledRule, ...]
    by_merchant: Mapping[str, tuple[CompiledRule, ...]]

    @classmethod
    def of(cls, rules: tuple[CompiledRule, ...]) -> RuleIndex:
        """The index of ``rules`` (already in rank order)."""
        by_merchant: dict[str, list[CompiledRule]] = {}
        for rule in rules:
            for merchant in rule.merchants or ():
                by_merchant.setdefault(merchant, []).append(rule)
        return cls(
            tuple(r for r in rules if r.merchants is None),
            {m: tuple(found) for m, found in by_merchant.items()},
        )

    def first(self, payment: Payment, features: Mapping[str, float]) -> CompiledRule | None:
        """The first rule in rank order that fires."""
        mine = self.by_merchant.get(payment.merchant_id)
        anywhere = _first(self.everywhere, payment, features)
        scoped = _first(mine, payment, features) if mine else None
        if scoped is None or (anywhere is not None and anywhere.rank < scoped.rank):
            return anywhere
        return scoped

    def fired(self, payment: Payment, features: Mapping[str, float]) -> list[CompiledRule]:
        """Every rule that fires, in rank order."""
        found = [r for r in self.everywhere if r.fires(payment, features)]
        mine = self.by_merchant.get(payment.merchant_id)
        if mine:
            found += [r for r in mine if r.fires(payment, features)]
            found.sort(key=lambda r: r.rank)
        return found


@dataclass(frozen=True, slots=True)
class Policy:
    """A compiled policy: live rules in the order they are asked, shadow rules beside."""

    version: str
    live: tuple[CompiledRule, ...]
    shadow: tuple[CompiledRule, ...]
    merchant_thresholds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """Merchant → (review, decline) of the model's score, where the policy sets them."""
    category_thresholds: Mapping[float, tuple[float, float]] = field(default_factory=dict)
    """Merchant category → (review, decline), for a merchant without its own."""
    uses_features: bool = field(init=False)
    """Whether any rule reads a feature (the caller builds them by name only then)."""
    _live: RuleIndex = field(init=False)
    _shadow: RuleIndex = field(init=False)

    def __post_init__(self) -> None:
        # Frozen: the derived fields are set once, here.
        object.__setattr__(
            self,
            "uses_features",
            bool(self.category_thresholds) or any(r.uses_features for r in self.live + self.shadow),
        )
        object.__setattr__(self, "_live", RuleIndex.of(self.live))
        object.__setattr__(self, "_shadow", RuleIndex.of(self.shadow))

    def thresholds_for(
        self, merchant_id: str, features: Mapping[str, float]
    ) -> tuple[float, float] | None:
        """(review, decline) of the model's score the policy sets for this merchant: its own,
        else its category's (from ``features``), else None (the model version's)."""
        own = self.merchant_thresholds.get(merchant_id) if self.merchant_thresholds else None
        if own is None and self.category_thresholds:
            own = self.category_thresholds.get(features.get(CATEGORY_FEATURE, math.nan))
        return own

    def decide(self, payment: Payment, features: Mapping[str, float]) -> CompiledRule | None:
        """The first live rule that fires, by priority (highest first, then file order)."""
        return self._live.first(payment, features)

    def shadowed(self, payment: Payment, features: Mapping[str, float]) -> tuple[str, ...]:
        """``name=action`` of every shadow rule that fires, in priority order."""
        return tuple(f"{r.name}={r.action.value}" for r in self._shadow.fired(payment, features))


def _load_yaml(text: str) -> Any:
    """The YAML document, refused when too large, too deep or using aliases."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES:
        raise PolicyError("", "", f"policy is larger than {MAX_POLICY_BYTES} bytes")
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise PolicyError("", "", "YAML aliases are not allowed in a policy")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise PolicyError("", "", f"policy is nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PolicyError("", "", f"not valid YAML: {error}".replace("\n", " ")) from error


def _rule_name(doc: Any, index: int) -> str:
    """The name written for rule ``index``, or ``#index`` when it has none."""
    try:
        name = doc["rules"][index]["name"]
    except (KeyError, IndexError, TypeError):
        name = None
    return name if isinstance(name, str) and name else f"#{index + 1}"


_UNION_TAGS = frozenset({"float", "int"})


def _first_error(doc: Any, error: ValidationError) -> PolicyError:
    """The first problem pydantic found, as one error naming the rule and the field."""
    first = error.errors()[0]
    # A number is an int or a float: pydantic names the union's member tried in the path.
    loc = [str(part) for part in first["loc"] if part not in _UNION_TAGS]
    rule = ""
    if len(loc) >= 2 and loc[0] == "rules" and loc[1].isdigit():
        rule = _rule_name(doc, int(loc[1]))
        loc = loc[2:]
    field = ".".join(loc) or ("(the rule)" if rule else "rules")
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    return PolicyError(rule, field, message)


def parse(text: str) -> PolicySpec:
    """Reads and checks a policy; raises one ``PolicyError`` naming the rule and the field."""
    doc = _load_yaml(text)
    if not isinstance(doc, dict):
        raise PolicyError("", "rules", "a policy is a mapping with a list of rules")
    try:
        spec = PolicySpec.model_validate(doc)
    except ValidationError as error:
        raise _first_error(doc, error) from None
    _check_meaning(spec)
    return spec


def _check_thresholds(spec: PolicySpec) -> None:
    """Review at most decline, and each merchant and category in one entry only."""
    seen: set[tuple[str, str | int]] = set()
    for i, entry in enumerate(spec.thresholds):
        if entry.review > entry.decline:
            raise PolicyError("", f"thresholds.{i}.review", "must not be above decline")
        for key, values in (("merchants", entry.merchants), ("categories", entry.categories)):
            for value in values or ():
                if (key, value) in seen:
                    shown = repr(value[:64]) if isinstance(value, str) else value
                    raise PolicyError(
                        "", f"thresholds.{i}.{key}", f"{shown} has thresholds already"
                    )
                seen.add((key, value))


def _check_meaning(spec: PolicySpec) -> None:
    """What the models cannot say alone: unique names, known features, usable bounds."""
    _check_thresholds(spec)
    known = set(featurespec.SERVABLE_FEATURES)
    seen: set[str] = set()
    for rule in spec.rules:
        if rule.name in seen:
            raise PolicyError(rule.name, "name", "another rule has this name")
        seen.add(rule.name)
        when = rule.when
        for name, compare in (when.features or {}).items():
            if name not in known:
                raise PolicyError(rule.name, f"when.features.{name}", "unknown feature")
            _check_compare(rule.name, f"when.features.{name}", compare)
        if when.amount_eur is not None:
            _check_compare(rule.name, "when.amount_eur", when.amount_eur)


def _check_compare(rule: str, field: str, compare: Compare) -> None:
    bounds = compare.model_dump(exclude_none=True)
    if not bounds:
        raise PolicyError(rule, field, "needs at least one of gt, gte, lt, lte, eq")
    for name, value in bounds.items():
        if not math.isfinite(value):
            raise PolicyError(rule, f"{field}.{name}", "must be a finite number")


def _bound_check(
    op: Callable[[float, float], bool],
    bound: float,
    value_of: Callable[[Payment, Mapping[str, float]], float],
) -> Check:
    return lambda p, f: op(value_of(p, f), bound)


def _compare_check(
    compare: Compare, value_of: Callable[[Payment, Mapping[str, float]], float]
) -> list[Check]:
    return [
        _bound_check(_BOUNDS[name], float(bound), value_of)
        for name, bound in compare.model_dump(exclude_none=True).items()
    ]


def _feature_value(name: str) -> Callable[[Payment, Mapping[str, float]], float]:
    return lambda _p, f: f.get(name, math.nan)


def _checks(rule: RuleSpec) -> list[Check]:
    """The rule's conditions as predicates, cheapest first (its scope is indexed)."""
    w = rule.when
    checks: list[Check] = []
    if w.channel is not None:
        cnp = w.channel == "card_not_present"
        checks.append(lambda p, _f: p.card_not_present is cnp)
    if w.merchant is not None:
        merchants = frozenset(w.merchant)
        checks.append(lambda p, _f: p.merchant_id in merchants)
    if w.terminal is not None:
        terminals = frozenset(w.terminal)
        checks.append(lambda p, _f: p.terminal_id in terminals)
    if w.currency is not None:
        currencies = frozenset(w.currency)
        checks.append(lambda p, _f: p.currency in currencies)
    if w.card_prefix is not None:
        prefixes = tuple(w.card_prefix)
        checks.append(lambda p, _f: p.card_id.startswith(prefixes))
    if w.amount_eur is not None:
        checks += _compare_check(w.amount_eur, lambda p, _f: p.amount_eur)
    for name, compare in (w.features or {}).items():
        checks += _compare_check(compare, _feature_value(name))
    return checks


def compile_policy(spec: PolicySpec, version: str) -> Policy:
    """The policy's rules as predicates: live rules by priority (highest first, then the
    order written), shadow rules beside them in the same order."""
    ordered = sorted(enumerate(spec.rules), key=lambda item: (-item[1].priority, item[0]))
    compiled = [
        CompiledRule(
            rule.name,
            rule.action,
            rule.reason or f"{rule.action.value} by rule {rule.name}",
            rule.priority,
            rule.mode,
            tuple(_scope_checks(rule.scope) + _checks(rule)),
            bool(rule.when.features) or _by_category(rule.scope),
            rank,
            _indexed_merchants(rule.scope),
        )
        for rank, (_, rule) in enumerate(ordered)
    ]
    return Policy(
        version,
        tuple(r for r in compiled if r.mode is Mode.LIVE),
        tuple(r for r in compiled if r.mode is Mode.SHADOW),
        {m: (t.review, t.decline) for t in spec.thresholds for m in t.merchants or ()},
        {float(c): (t.review, t.decline) for t in spec.thresholds for c in t.categories or ()},
    )


def _by_category(scope: Scope | None) -> bool:
    return scope is not None and scope.categories is not None


def _indexed_merchants(scope: Scope | None) -> frozenset[str] | None:
    """The merchants the index files the rule under; None (asked for every call) when the
    rule applies everywhere or by category, which only the call's features tell."""
    if scope is None or scope.categories is not None:
        return None
    return frozenset(scope.merchants or ())


def _scope_checks(scope: Scope | None) -> list[Check]:
    """A category scope as a check, first: a listed merchant, or one whose category (the
    store's feature) is listed."""
    if scope is None or scope.categories is None:
        return []
    merchants = frozenset(scope.merchants or ())
    categories = frozenset(float(c) for c in scope.categories)
    return [
        lambda p, f: p.merchant_id in merchants or f.get(CATEGORY_FEATURE, math.nan) in categories
    ]


def load(text: str, version: str) -> Policy:
    """Parses, checks and compiles a policy text (``parse``, then ``compile_policy``)."""
    return compile_policy(parse(text), version)
