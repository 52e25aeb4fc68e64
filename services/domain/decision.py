"""Decisions and how a score becomes one under a version's thresholds."""

from __future__ import annotations

import enum


class Decision(enum.Enum):
    """What the payment system should do."""

    APPROVE = "approve"
    REVIEW = "review"
    DECLINE = "decline"


def decide(score: float, review: float, decline: float) -> Decision:
    """Decline at or above ``decline``, review at or above ``review``, else approve."""
    if score >= decline:
        return Decision.DECLINE
    if score >= review:
        return Decision.REVIEW
    return Decision.APPROVE
