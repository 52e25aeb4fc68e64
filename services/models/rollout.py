"""A staged rollout handed to the monitor: the plan, where it is, and every step's figures.

``fraudmesh model rollout`` (or ``model shadow --min-decisions``) writes the plan into
``<model_root>/<name>/rollout.json``; the rollout controller in the monitor
(``services/monitor/controller.py``) carries it out and writes its progress back into the same
file after every step, so a restarted monitor resumes where it was. Changes are made under
``.rollout.lock`` and the file is replaced atomically; readers need no lock. One rollout at a
time per model: a finished one stays in the file, for ``fraudmesh model list``, until the
next one replaces it.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from services.common import filecommit
from services.models import repository
from services.models.lifecycle import CorruptLifecycleFile

ROLLOUT_FILE = "rollout.json"
"""The rollout file inside ``<model_root>/<name>/``."""
LOCK_FILE = ".rollout.lock"
DEFAULT_STEPS: tuple[float, ...] = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)
"""Canary shares of a rollout, in percent; the last (100) is the promotion."""
CONTROLLER = "rollout controller"
"""Who the lifecycle history says made the controller's changes."""


class Phase(enum.StrEnum):
    """Where a rollout is."""

    SHADOW = "shadow"
    CANARY = "canary"
    APPROVAL = "approval"
    """Every canary step passed; waiting for ``fraudmesh model approve``."""
    DONE = "done"


class RolloutEnd(enum.StrEnum):
    """How a rollout ended."""

    PROMOTED = "promoted"
    ROLLED_BACK = "rolled back"
    SHADOW_PASSED = "shadow gate passed"
    SHADOW_FAILED = "shadow gate failed"
    STOPPED = "stopped"
    """The version left the rollout by another hand (retired, promoted, rolled back)."""


class Comparison(BaseModel):
    """One figure of the candidate against live, with what it was allowed."""

    name: str
    passed: bool
    candidate: float | None = None
    live: float | None = None
    detail: str = ""


class StepResult(BaseModel):
    """The verdict of one step (the shadow gate, or one canary share)."""

    step: str = Field(description="'shadow' or 'canary 5%'.")
    at: datetime
    passed: bool
    decisions: int = Field(description="Candidate decisions the verdict rests on.")
    live_decisions: int
    seconds: float = Field(description="How long the step ran.")
    comparisons: list[Comparison]

    def failures(self) -> list[Comparison]:
        """The comparisons that failed."""
        return [c for c in self.comparisons if not c.passed]

    def summary(self) -> str:
        """The verdict in one line: the failures, or every figure when it passed."""
        shown = self.failures() or self.comparisons
        return "; ".join(f"{c.name} {c.detail}" for c in shown)


class RolloutPlan(BaseModel):
    """A rollout: what was asked, and how far it got."""

    version: str
    steps: list[float] = Field(description="Canary shares in percent; the last is 100.")
    shadow_min_decisions: int = Field(ge=0, description="0: no shadow gate.")
    step_min_decisions: int = Field(ge=1)
    step_max_seconds: float = Field(gt=0)
    require_approval: bool
    stop_after_shadow: bool = Field(False, description="The shadow gate alone was asked.")
    policy: dict[str, float] = Field(
        default_factory=dict,
        description="Canary policy fields this rollout is judged by instead of the monitor's "
        "settings (``fraudmesh model rollout --policy NAME=VALUE``).",
    )
    requested_by: str
    requested_at: datetime
    phase: Phase
    step: int = Field(0, description="Index of the current canary share.")
    step_started_at: datetime | None = Field(None, description="None: not started yet.")
    window_from: datetime | None = Field(
        None,
        description="The start of the current gate's window: the first whole slice after the "
        "shadow's first score (before it, the gateways were still loading it), or after the "
        "canary step's first routed call (before it, live took every call).",
    )
    outcome: RolloutEnd | None = None
    reason: str = ""
    finished_at: datetime | None = None
    results: list[StepResult] = Field(default_factory=list)

    @property
    def finished(self) -> bool:
        """True once the rollout ended, whichever way."""
        return self.phase is Phase.DONE

    def where(self) -> str:
        """Where the rollout is, in words."""
        if self.phase is Phase.DONE:
            outcome = self.outcome.value if self.outcome else "done"
            return self.reason if self.reason.startswith(outcome) else f"{outcome}: {self.reason}"
        if self.phase is Phase.SHADOW:
            return f"shadow gate (needs {self.shadow_min_decisions} decisions)"
        if self.phase is Phase.APPROVAL:
            return f"every step passed; waiting for `fraudmesh model approve {self.version}`"
        return f"canary step {self.step + 1} of {len(self.steps)} at {self.steps[self.step]:g}%"


def check_steps(steps: list[float]) -> str | None:
    """What is wrong with a list of canary shares, or None: increasing, each in (0, 100] at a
    resolution of 0.01, ending at 100 (the promotion)."""
    if not steps:
        return "needs at least one step"
    for share in steps:
        if not 0 < round(share, 2) <= 100:  # False for NaN
            return f"{share:g} is not a share from 0.01 to 100"
    if any(b <= a for a, b in itertools.pairwise(steps)):
        return "shares must increase"
    if steps[-1] != 100:
        return "the last step must be 100 (the promotion)"
    return None


class RolloutFile:
    """The rollout file of one model."""

    def __init__(self, model_root: Path, name: str = repository.DEFAULT_MODEL_NAME) -> None:
        repository.check_name("name", name)
        self.folder = model_root / name
        self.path = self.folder / ROLLOUT_FILE

    def read(self) -> RolloutPlan | None:
        """The current (or last) rollout, or None when there was none."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return RolloutPlan.model_validate_json(data)
        except ValidationError as error:
            raise CorruptLifecycleFile(
                f"{self.path} is not a rollout file ({error.error_count()} problems): "
                "repair or remove it"
            ) from error

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Holds the rollout lock: changes made inside are not interleaved with others'."""
        return filecommit.locked(self.folder / LOCK_FILE)

    def write(self, plan: RolloutPlan) -> None:
        """Replaces the file atomically (call under ``locked``)."""
        filecommit.replace_bytes(self.path, plan.model_dump_json(indent=2).encode())
