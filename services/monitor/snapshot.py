"""What the monitor says about each version at one moment: drift in the rolling window,
decision rates, live quality by maturity, and the reference they are judged against.

The gauges (``metrics.py``) and the retraining advice (``advice.py``) read a snapshot; a
rollout controller reads the engine's windows directly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from services.models.reference import ModelReference
from services.monitor import tally
from services.monitor.engine import MonitorEngine
from services.monitor.evaluation import Figures
from services.monitor.rulewatch import RuleView
from services.monitor.tally import Drift


@dataclass(frozen=True)
class VersionView:
    """One version's figures."""

    version: str
    window_decisions: dict[str, int]
    """Decisions in the rolling window, by arm."""
    drift: Drift
    """Of the answering arms (live, canary), or of the shadow arm for a version that only
    shadows."""
    decision_ratio: dict[str, float]
    live: dict[str, Figures] = field(default_factory=dict)
    """``matured`` and ``immature`` figures (empty for a version without cohorts)."""
    reference: ModelReference | None = None


@dataclass(frozen=True)
class Snapshot:
    """Every version seen in the window or with cohorts."""

    at: float
    versions: dict[str, VersionView]
    rules: list[RuleView] = field(default_factory=list)
    """The fraud team's rules, live and in shadow: fire rate and precision."""


def take(engine: MonitorEngine, now_s: float | None = None) -> Snapshot:
    """The engine's figures now."""
    now = time.time() if now_s is None else now_s
    since = now - engine.policy.window_s
    seen = engine.versions(since) | engine.evaluated_versions()
    views = {}
    for version in sorted(seen):
        windows = {arm: engine.window(version, (arm,), since) for arm in tally.ARMS}
        answering = tally.merged(windows[a] for a in ("live", "canary"))
        judged = answering if answering.decisions else windows["shadow"]
        layout = engine.layout(version)
        views[version] = VersionView(
            version=version,
            window_decisions={arm: w.decisions for arm, w in windows.items()},
            drift=tally.drift(layout, judged, engine.policy.min_decisions),
            decision_ratio=tally.decision_ratios(judged),
            live=engine.evaluation(version, now),
            reference=layout.reference,
        )
    return Snapshot(now, views, engine.rule_views(now))


def finite(value: float) -> bool:
    """True for a number that is not NaN (a figure worth acting on)."""
    return not math.isnan(value)
