"""The autopilot: retrain from the decision log when it is due, then hand a candidate whose
gates passed to the monitor's staged rollout (shadow gate, canary steps, approval).

One run decides once and exits (a CronJob runs it on a schedule). A run is **due** when the
monitor advised retraining since the last run (``advice.jsonl``: drift or live quality), when
the last run is older than ``max_age_days``, or when forced. It is **skipped** while a rollout
is under way (the candidate in flight is judged first). A due run trains with
``retraining.train_from_decisions`` (the history plus the decision log and its outcomes), and
the new version's history says why it was trained, how its gates went and what happened
next: handed to the rollout controller, or left a candidate with the failed gates named.
The last run is remembered in ``<model_root>/<name>/autopilot.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from services.common import filecommit
from services.models import repository
from services.models.lifecycle import GateReport, ModelLifecycle
from services.models.rollout import DEFAULT_STEPS, Phase, RolloutFile, RolloutPlan

STATE_FILE = "autopilot.json"
"""The autopilot's memory inside ``<model_root>/<name>/``."""
ACTOR = "autopilot"


@dataclass(frozen=True)
class AutopilotPolicy:
    """When a run is due and how the candidate is rolled out."""

    max_age_days: float = 7.0
    """Retrain at least this often, advice or not."""
    steps: tuple[float, ...] = DEFAULT_STEPS
    shadow_min_decisions: int = 1000
    step_min_decisions: int = 1000
    step_max_seconds: float = 3600.0
    require_approval: bool = True
    """Stop before the last step until ``fraudmesh model approve``: a model nobody looked at
    does not take all traffic by default."""


@dataclass(frozen=True)
class Trained:
    """What a training run published: its version and its gate report."""

    version: str
    gates: GateReport | None


@dataclass(frozen=True)
class AutopilotRun:
    """What one run decided, in words, and the version it published (if any)."""

    decision: str
    version: str | None = None


def due(
    advice: Iterable[dict[str, Any]],
    last_run: datetime | None,
    now: datetime,
    policy: AutopilotPolicy,
) -> str | None:
    """Why a run is due now, or None."""
    since = last_run.timestamp() if last_run is not None else -1.0
    fresh = [a for a in advice if float(a.get("at_s", 0.0)) > since]
    if fresh:
        reasons = sorted({f"{a.get('reason')} of v{a.get('model_version')}" for a in fresh})
        return f"the monitor advised retraining ({', '.join(reasons)})"
    if last_run is None:
        return "no run before"
    if now - last_run >= timedelta(days=policy.max_age_days):
        return f"the last run was more than {policy.max_age_days:g} days ago"
    return None


class Autopilot:
    """One model's autopilot."""

    def __init__(
        self,
        model_root: Path,
        advice_file: Path,
        train: Callable[[], Trained],
        policy: AutopilotPolicy | None = None,
        name: str = repository.DEFAULT_MODEL_NAME,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.lifecycle = ModelLifecycle(model_root, name)
        self.plans = RolloutFile(model_root, name)
        self.state_path = model_root / name / STATE_FILE
        self.advice_file = advice_file
        self.train = train
        self.policy = policy or AutopilotPolicy()
        self._clock = clock

    def last_run(self) -> datetime | None:
        """When the last due run started (None: never)."""
        try:
            data = json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return datetime.fromisoformat(data["last_run_at"]) if "last_run_at" in data else None

    def _remember(self, at: datetime, decision: str, version: str | None) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        body = {"last_run_at": at.isoformat(), "decision": decision, "version": version}
        filecommit.replace_bytes(self.state_path, json.dumps(body).encode())

    def run(self, force: bool = False) -> AutopilotRun:
        """Decides whether to retrain, and does what it decided."""
        from services.monitor.advice import read as read_advice

        now = self._clock()
        current = self.plans.read()
        if current is not None and not current.finished:
            return AutopilotRun(
                f"skipped: v{current.version} is being rolled out ({current.where()})"
            )
        why = (
            "forced"
            if force
            else due(read_advice(self.advice_file), self.last_run(), now, self.policy)
        )
        if why is None:
            return AutopilotRun("not due: no advice since the last run, which is recent")
        trained = self.train()
        version = trained.version
        gates = trained.gates
        if gates is not None and not gates.passed:
            failed = "; ".join(f"{c.name}: {c.detail}" for c in gates.failures())
            decision = (
                f"autopilot: retrained because {why}; gates failed ({failed}): not rolled out"
            )
            self.lifecycle.annotate(version, decision, by=ACTOR)
            self._remember(now, decision, version)
            return AutopilotRun(decision, version)
        p = self.policy
        plan = RolloutPlan(
            version=version,
            steps=list(p.steps),
            shadow_min_decisions=p.shadow_min_decisions,
            step_min_decisions=p.step_min_decisions,
            step_max_seconds=p.step_max_seconds,
            require_approval=p.require_approval,
            requested_by=ACTOR,
            requested_at=now,
            phase=Phase.SHADOW if p.shadow_min_decisions else Phase.CANARY,
        )
        approval = (
            "waits for `fraudmesh model approve` before the last step"
            if p.require_approval
            else "promotes after the last step"
        )
        against = f" against v{gates.against}" if gates is not None and gates.against else ""
        decision = (
            f"autopilot: retrained because {why}; gates passed{against}; handed to the rollout "
            f"controller (shadow gate, then {', '.join(f'{s:g}%' for s in p.steps)}), which "
            f"{approval}"
        )
        with self.plans.locked():
            running = self.plans.read()
            if running is not None and not running.finished:
                decision = f"autopilot: retrained because {why}; v{running.version} is being rolled out: left a candidate"
            else:
                self.plans.write(plan)
        self.lifecycle.annotate(version, decision, by=ACTOR)
        self._remember(now, decision, version)
        return AutopilotRun(decision, version)
