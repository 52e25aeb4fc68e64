"""Backtest of a policy: what its rules would have done to payments already decided.

``replay`` gives one logged decision the answer the gateway would have given with a policy
live, through the very evaluation the gateway runs (``Policy.decide`` and ``Policy.shadowed``
on ``policy.payment_of`` and the features by name, ``decision.decide`` on the logged score
for a merchant's own thresholds). What the log cannot tell is said, not guessed: a payment a
list decided is left to the list (the lists are asked before the policy), and a payment a
rule decided when it was logged, which no rule of the candidate decides, has no model score
to fall back on: its answer is ``None`` (unresolved).

``backtest`` tallies every rule (live and shadow, each on its own, whatever its rank) and the
whole policy over the rows: how often it fires, the frauds and the good payments among them
(counts and amounts in EUR), its precision and recall, and the overlap with what was already
flagged (logged as review or decline). The console calls the same function
(docs/controls.md, "Backtests").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.domain import money
from services.domain.decision import Decision, decide
from services.domain.policy import CompiledRule, Payment, Policy, payment_of

FRAUD = "fraud"
"""The outcome of a fraudulent payment (the decision log's stored name)."""
LEGITIMATE = "legitimate"
"""The outcome of a good payment."""
FLAGGED = frozenset({Decision.REVIEW.value, Decision.DECLINE.value})
"""Logged decisions that already stopped or held a payment."""

_LISTS_PREFIX = "lists-"
_POLICY_PREFIX = "policy-"
_OWN_THRESHOLDS = "the merchant's own thresholds"


@dataclass(frozen=True, slots=True)
class LoggedPayment:
    """One payment as logged: its request fields, the features by name, what was answered
    (empty ``decision`` for an imported transaction nobody decided) and its outcome."""

    transaction_id: str
    card_id: str
    merchant_id: str
    terminal_id: str
    amount_minor: int
    currency: str
    card_not_present: bool
    features: Mapping[str, float]
    outcome: str | None = None
    """``fraud``, ``legitimate``, another stored outcome, or None when none arrived."""
    decision: str = ""
    score: float | None = None
    scored_by: str = ""
    model_version: str = ""
    reasons: tuple[str, ...] = ()
    shadow_rules: tuple[str, ...] = ()

    @property
    def amount_eur(self) -> float:
        """The amount in EUR at the mesh's fixed rates."""
        return money.amount_eur(self.amount_minor, self.currency)

    @property
    def decided_by_list(self) -> bool:
        """Whether a block or allow list answered (the policy was not asked)."""
        return self.scored_by == "rules" and self.model_version.startswith(_LISTS_PREFIX)

    @property
    def decided_by_rule(self) -> bool:
        """Whether a live rule of a policy answered (no model score was computed)."""
        return self.scored_by == "rules" and self.model_version.startswith(_POLICY_PREFIX)


@dataclass(frozen=True, slots=True)
class Replayed:
    """The answer one payment would have had with the policy live."""

    transaction_id: str
    decision: str | None
    """``approve``, ``review``, ``decline``; None when the log cannot tell (unresolved)."""
    rule: str | None
    """The live rule that decided, if one did."""
    shadow_rules: tuple[str, ...]
    """``name=action`` of the policy's shadow rules that fired (as the decision event has)."""
    why: str
    """``rule``, ``list``, ``thresholds``, ``as logged``; without an answer: ``no score``,
    ``no thresholds`` (the log cannot tell) or ``not logged`` (imported history)."""


def _features(policy: Policy, row: LoggedPayment) -> Mapping[str, float]:
    return row.features if policy.uses_features else {}


def _without_rule(policy: Policy, row: LoggedPayment) -> tuple[str | None, str]:
    """The answer when no live rule fires: the model's (or a fallback's) as logged, on the
    policy's thresholds for the merchant where it sets them."""
    if not row.decision:
        # An imported transaction: no answer was logged for it.
        return None, "not logged"
    if row.decided_by_rule:
        return None, "no score"
    own = policy.thresholds_for(row.merchant_id, _features(policy, row))
    logged_own = any(r.startswith(_OWN_THRESHOLDS) for r in row.reasons)
    if row.scored_by == "model" and own is not None and row.score is not None:
        return decide(row.score, own[0], own[1]).value, "thresholds"
    if own is not None and row.scored_by == "first_stage":
        # The first stage may not approve at such a merchant: the model would have been asked.
        return None, "no score"
    if logged_own and row.scored_by == "model":
        # Decided on another policy's thresholds; the version's own are not in the log.
        return None, "no thresholds"
    return row.decision or None, "as logged"


def replay(policy: Policy, row: LoggedPayment) -> Replayed:
    """The answer the gateway would have given ``row`` with ``policy`` live."""
    if row.decided_by_list:
        return Replayed(row.transaction_id, row.decision, None, (), "list")
    payment = _payment(row)
    features = _features(policy, row)
    shadow = policy.shadowed(payment, features) if policy.shadow else ()
    rule = policy.decide(payment, features)
    if rule is not None:
        return Replayed(row.transaction_id, rule.action.value, rule.name, shadow, "rule")
    decision, why = _without_rule(policy, row)
    return Replayed(row.transaction_id, decision, None, shadow, why)


@dataclass(slots=True)
class Tally:
    """A count of payments and their amount in EUR."""

    count: int = 0
    amount_eur: float = 0.0

    def add(self, amount_eur: float) -> None:
        """Counts one payment of ``amount_eur``."""
        self.count += 1
        self.amount_eur += amount_eur


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(slots=True)
class Figures:
    """What a rule (or the whole policy) did to a set of payments."""

    fires: Tally = field(default_factory=Tally)
    """Payments it fired on (for the policy: held, reviewed or declined)."""
    frauds: Tally = field(default_factory=Tally)
    """Of those, the frauds (for an approve rule, the frauds it would let through)."""
    goods: Tally = field(default_factory=Tally)
    """Of those, the legitimate payments it hit."""
    overlap: Tally = field(default_factory=Tally)
    """Of those, the payments already flagged (logged as review or decline)."""
    new_frauds: Tally = field(default_factory=Tally)
    """Frauds it fired on that were not flagged (what it adds to the model)."""
    all_frauds: int = 0
    """Frauds among every payment (recall's denominator)."""

    @property
    def precision(self) -> float | None:
        """Frauds over labelled payments it fired on; None without any."""
        return _ratio(self.frauds.count, self.frauds.count + self.goods.count)

    @property
    def recall(self) -> float | None:
        """Frauds it fired on over every fraud; None without frauds."""
        return _ratio(self.frauds.count, self.all_frauds)

    def count(self, row: LoggedPayment, amount: float) -> None:
        """Counts a payment it fired on."""
        self.fires.add(amount)
        flagged = row.decision in FLAGGED
        if flagged:
            self.overlap.add(amount)
        if row.outcome == FRAUD:
            self.frauds.add(amount)
            if not flagged and row.decision:
                self.new_frauds.add(amount)
        elif row.outcome == LEGITIMATE:
            self.goods.add(amount)


@dataclass(frozen=True, slots=True)
class RuleReport:
    """One rule's figures."""

    name: str
    action: str
    mode: str
    figures: Figures


@dataclass(frozen=True, slots=True)
class BacktestReport:
    """A policy's backtest over some payments."""

    version: str
    payments: int
    frauds: Tally
    goods: Tally
    unlabelled: int
    rules: tuple[RuleReport, ...]
    policy: Figures
    """The policy's answers: ``fires`` counts those held (review or decline)."""
    logged: Figures
    """The logged answers, tallied the same way (for comparison; empty for history)."""
    changed: int
    """Payments whose answer differs from the logged one (resolved ones only)."""
    unresolved: int
    """Payments whose answer with the policy live the log cannot tell (``Replayed.why``)."""
    replayed: tuple[Replayed, ...]


def _payment(row: LoggedPayment) -> Payment:
    """The logged request as the policy judges it (the gateway's ``payment_of``)."""
    return payment_of(
        row.card_id,
        row.merchant_id,
        row.terminal_id,
        row.amount_minor,
        row.currency,
        row.card_not_present,
    )


def _rule_fires(rule: CompiledRule, policy: Policy, row: LoggedPayment) -> bool:
    """Whether ``rule`` alone fires on ``row`` (in its scope), whatever its rank."""
    if rule.merchants is not None and row.merchant_id not in rule.merchants:
        return False
    return rule.fires(_payment(row), _features(policy, row))


def _held(decision: str | None) -> bool:
    return decision in FLAGGED


def backtest(policy: Policy, rows: Iterable[LoggedPayment]) -> BacktestReport:
    """Replays every row with ``policy`` live and tallies each rule and the whole policy."""
    payments = list(rows)
    rules = sorted(policy.live + policy.shadow, key=lambda r: r.rank)
    per_rule = {r.name: Figures() for r in rules}
    whole, logged = Figures(), Figures()
    frauds, goods = Tally(), Tally()
    replayed: list[Replayed] = []
    changed = unresolved = 0
    for row in payments:
        amount = row.amount_eur
        if row.outcome == FRAUD:
            frauds.add(amount)
        elif row.outcome == LEGITIMATE:
            goods.add(amount)
        for rule in rules:
            if _rule_fires(rule, policy, row):
                per_rule[rule.name].count(row, amount)
        answer = replay(policy, row)
        replayed.append(answer)
        if answer.decision is None:
            unresolved += 1
        elif row.decision and answer.decision != row.decision:
            changed += 1
        if _held(answer.decision):
            whole.count(row, amount)
        if _held(row.decision):
            logged.count(row, amount)
    for figures in (*per_rule.values(), whole, logged):
        figures.all_frauds = frauds.count
    return BacktestReport(
        version=policy.version,
        payments=len(payments),
        frauds=frauds,
        goods=goods,
        unlabelled=len(payments) - frauds.count - goods.count,
        rules=tuple(
            RuleReport(r.name, r.action.value, r.mode.value, per_rule[r.name]) for r in rules
        ),
        policy=whole,
        logged=logged,
        changed=changed,
        unresolved=unresolved,
        replayed=tuple(replayed),
    )
