"""Validation of a transaction to score and of a reported outcome; every failure names the field."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.errors import InvalidArgument
from services.domain import money
from services.domain.validation import check_currency, check_id


@dataclass(frozen=True, slots=True)
class Limits:
    """What a plausible transaction looks like."""

    max_future_s: float = 300.0
    """Clock skew tolerated for timestamps ahead of the gateway's clock."""
    max_age_s: float = 7 * 86_400.0
    """Oldest transaction still scored in real time."""
    max_amount_eur: float = 1_000_000.0
    """Largest amount (EUR equivalent) a card payment can plausibly have."""
    max_outcome_age_s: float = 540 * 86_400.0
    """Oldest ``reported_at`` of an outcome (card schemes allow disputes up to 540 days)."""


@dataclass(frozen=True, slots=True)
class Transaction:
    """A validated transaction, in plain values."""

    transaction_id: str
    card_id: str
    merchant_id: str
    amount_minor: int
    currency: str
    timestamp_s: float
    terminal_id: str
    card_not_present: bool


def validate(
    *,
    transaction_id: str,
    card_id: str,
    merchant_id: str,
    amount_minor: int,
    currency: str,
    timestamp_s: float | None,
    terminal_id: str,
    card_not_present: bool,
    now_s: float,
    limits: Limits,
) -> Transaction:
    """Returns the transaction if it is plausible; raises InvalidArgument naming the field."""
    check_id("transaction_id", transaction_id)
    check_id("card_id", card_id)
    check_id("merchant_id", merchant_id)
    check_id("terminal_id", terminal_id, required=False)
    check_currency("currency", currency)
    # Zero is traffic: card schemes' account verifications, and card testers using them.
    if amount_minor < 0:
        raise InvalidArgument("amount_minor", "must not be negative")
    amount_eur = money.amount_eur(amount_minor, currency)
    if amount_eur > limits.max_amount_eur:
        raise InvalidArgument(
            "amount_minor",
            f"{amount_minor} {currency} minor units (~{amount_eur:,.0f} EUR) exceeds "
            f"the {limits.max_amount_eur:,.0f} EUR limit",
        )
    if timestamp_s is None:
        raise InvalidArgument("timestamp", "is required")
    if timestamp_s > now_s + limits.max_future_s:
        raise InvalidArgument(
            "timestamp",
            f"is {timestamp_s - now_s:.0f} s in the future (limit {limits.max_future_s:.0f} s)",
        )
    if timestamp_s < now_s - limits.max_age_s:
        raise InvalidArgument("timestamp", f"is older than {limits.max_age_s / 86_400:.0f} days")
    return Transaction(
        transaction_id=transaction_id,
        card_id=card_id,
        merchant_id=merchant_id,
        amount_minor=amount_minor,
        currency=currency,
        timestamp_s=timestamp_s,
        terminal_id=terminal_id,
        card_not_present=card_not_present,
    )


class Verdict(enum.Enum):
    """What a decided transaction turned out to be (``fraud.v1.Outcome``)."""

    FRAUD = "fraud"
    LEGITIMATE = "legitimate"
    DISPUTED = "disputed"


class Reporter(enum.Enum):
    """Who reported an outcome (``fraud.v1.OutcomeSource``)."""

    CHARGEBACK = "chargeback"
    ANALYST = "analyst"
    CUSTOMER = "customer"
    ISSUER = "issuer"


@dataclass(frozen=True, slots=True)
class OutcomeReport:
    """A validated outcome report, in plain values."""

    transaction_id: str
    verdict: Verdict
    reporter: Reporter
    reported_at_s: float
    reported_by: str = ""
    """Who gave it within its source (an analyst's identity, a case id); empty: not given."""


_NANOS = 1_000_000_000


def validate_outcome(
    *,
    transaction_id: str,
    verdict: Verdict | None,
    reporter: Reporter | None,
    reported_at: tuple[int, int] | None,
    now_s: float,
    limits: Limits,
    reported_by: str = "",
) -> OutcomeReport:
    """Returns the report if it is plausible; raises InvalidArgument naming the field.

    ``verdict`` and ``reporter`` are None when the request left them unspecified or sent a
    number this version does not know; ``reported_at`` is the Timestamp's (seconds, nanos).
    """
    check_id("transaction_id", transaction_id)
    if verdict is None:
        names = ", ".join(v.name for v in Verdict)
        raise InvalidArgument("outcome", f"must be one of {names}")
    if reporter is None:
        names = ", ".join(r.name for r in Reporter)
        raise InvalidArgument("source", f"must be one of {names}")
    if reported_at is None:
        raise InvalidArgument("reported_at", "is required")
    seconds, nanos = reported_at
    if not 0 <= nanos < _NANOS:
        raise InvalidArgument("reported_at", "nanos must be in [0, 1e9)")
    reported_at_s = seconds + nanos / _NANOS
    if reported_at_s > now_s + limits.max_future_s:
        raise InvalidArgument(
            "reported_at",
            f"is {reported_at_s - now_s:.0f} s in the future (limit {limits.max_future_s:.0f} s)",
        )
    if reported_at_s < now_s - limits.max_outcome_age_s:
        raise InvalidArgument(
            "reported_at", f"is older than {limits.max_outcome_age_s / 86_400:.0f} days"
        )
    check_id("reported_by", reported_by, required=False)
    return OutcomeReport(transaction_id, verdict, reporter, reported_at_s, reported_by)
