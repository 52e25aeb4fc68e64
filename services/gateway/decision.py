"""Decisions and how a score becomes one under a version's thresholds (the domain's, so that
a backtest decides exactly as the gateway does: ``services.domain.decision``)."""

from __future__ import annotations

from services.domain.decision import Decision, decide

__all__ = ["Decision", "decide"]
