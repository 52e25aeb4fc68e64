"""The retraining signal: when drift or live quality crosses its threshold for long enough,
the monitor records a "retraining advised" entry with the figures.

Entries are JSON lines appended (and fsynced) to the advice file; the delivery work (an
automatic retraining) acts on them and ``fraudmesh monitor report`` shows them. A version is
advised at most once per reason per ``cooldown_s``; the gauge
``fraudmesh_retraining_advised`` stays 1 while a reason holds.

Reasons:

- ``score_drift``: the score's PSI at or above ``psi`` for ``sustain_s``;
- ``feature_drift``: a feature's PSI at or above ``psi`` for ``sustain_s`` (the entry names
  the features; the time of day, which a window shorter than a day always moves, is left out);
- ``live_precision`` / ``live_recall``: a matured figure below the low bound of the version's
  test-period interval, once ``min_frauds`` frauds have matured.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.models import reference as references
from services.monitor.evaluation import THRESHOLDS
from services.monitor.snapshot import Snapshot, VersionView

log = logging.getLogger(__name__)

ADVICE_FILE = "advice.jsonl"
"""The advice file's name in the monitor's state folder."""


@dataclass(frozen=True)
class AdvicePolicy:
    """When the monitor advises retraining."""

    psi: float = 0.2
    """PSI from which drift (score or feature) is major."""
    sustain_s: float = 1800.0
    """How long drift must hold before it is advice (one window's noise is not)."""
    min_frauds: int = 30
    """Matured labelled frauds before live quality is judged."""
    cooldown_s: float = 86_400.0
    """Least time between two advices of one version for one reason."""


class Advisor:
    """Watches snapshots and records advice."""

    def __init__(self, path: Path, policy: AdvicePolicy | None = None) -> None:
        self.path = path
        self.policy = policy or AdvicePolicy()
        self._since: dict[tuple[str, str], float] = {}
        self._last: dict[tuple[str, str], float] = {}
        for entry in read(path):
            key = (str(entry["model_version"]), str(entry["reason"]))
            self._last[key] = max(self._last.get(key, 0.0), float(entry["at_s"]))
        self.active: set[str] = set()
        """Versions a reason holds for now."""

    def observe(self, snapshot: Snapshot) -> list[dict[str, Any]]:
        """Records advice the snapshot calls for; returns the new entries."""
        recorded: list[dict[str, Any]] = []
        active: set[str] = set()
        now = snapshot.at
        for version, view in snapshot.versions.items():
            holding = self._reasons(view)
            for reason, figures in holding.items():
                active.add(version)
                key = (version, reason)
                since = self._since.setdefault(key, now)
                sustained = reason.startswith("live_") or now - since >= self.policy.sustain_s
                if not sustained or now - self._last.get(key, -math.inf) < self.policy.cooldown_s:
                    continue
                entry = {
                    "at": datetime.fromtimestamp(now, UTC).isoformat(),
                    "at_s": now,
                    "model_version": version,
                    "reason": reason,
                    "figures": figures,
                }
                self._append(entry)
                self._last[key] = now
                recorded.append(entry)
                log.warning("retraining advised", extra={"version": version, "reason": reason})
            for key in [k for k in self._since if k[0] == version and k[1] not in holding]:
                del self._since[key]
        self.active = active
        return recorded

    def _reasons(self, view: VersionView) -> dict[str, dict[str, Any]]:
        """Each reason that holds for ``view`` now, with its figures."""
        p = self.policy
        reasons: dict[str, dict[str, Any]] = {}
        drift = view.drift
        if drift.score_psi >= p.psi:
            reasons["score_drift"] = {"psi": drift.score_psi, "decisions": drift.decisions}
        drifted = {
            f: v
            for f, v in drift.feature_psi.items()
            if v >= p.psi and f not in references.CYCLIC_FEATURES
        }
        if drifted:
            reasons["feature_drift"] = {"psi": drifted, "decisions": drift.decisions}
        matured = view.live.get("matured")
        quality = view.reference.quality if view.reference is not None else None
        if matured is not None and quality is not None and matured.frauds >= p.min_frauds:
            for name, live, tested in (
                ("live_precision", matured.precision, quality.precision),
                ("live_recall", matured.recall, quality.recall),
            ):
                below = {
                    t: {"live": live[t].estimate, "tested_low": tested[t].low}
                    for t in THRESHOLDS
                    if live[t].estimate < tested[t].low
                }
                if below:
                    reasons[name] = {"thresholds": below, "frauds": matured.frauds}
        return reasons

    def _append(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, allow_nan=False, default=_clean) + "\n"
        with self.path.open("a") as out:
            out.write(line)
            out.flush()
            os.fsync(out.fileno())


def _clean(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The advice entries of a file (none when it does not exist); a torn last line (a crash
    while appending) is skipped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            yield entry
