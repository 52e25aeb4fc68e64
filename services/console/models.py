"""The Models page's facts that exist today: every published version of the model with its
state, traffic share, holdout metrics, thresholds, promotion gates, the staged rollout in
progress (or the last one) with every step's figures and verdict, and the lifecycle's recent
changes, read from ``routing.json``, ``rollout.json`` and each version's metadata
(``services.models``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from services.models import repository
from services.models.lifecycle import (
    CorruptLifecycleFile,
    GateCheck,
    ModelLifecycle,
    Transition,
)
from services.models.rollout import RolloutFile, RolloutPlan

METRICS = (
    ("pr_auc", "PR-AUC"),
    ("roc_auc", "ROC-AUC"),
    ("recall_at_1pct_fpr", "recall at 1% FPR"),
)
"""Holdout metrics shown, by metadata key and label."""


@dataclass(frozen=True)
class VersionView:
    """One published version."""

    version: str
    state: str
    since: datetime
    traffic: str
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    review_threshold: float | None = None
    decline_threshold: float | None = None
    created_at: datetime | None = None
    gates_passed: bool | None = None
    """None: published without gates."""
    gates: tuple[GateCheck, ...] = ()


@dataclass(frozen=True)
class ModelsView:
    """The model's versions and routing, or why they cannot be shown."""

    name: str
    model_root: Path
    versions: list[VersionView]
    live: str | None = None
    canary: str | None = None
    canary_percent: float | None = None
    shadow: str | None = None
    previous: str | None = None
    generation: int = 0
    history: list[Transition] = field(default_factory=list)
    rollout: RolloutPlan | None = None
    """The staged rollout in progress, or the last one (it stays until the next)."""
    problem: str | None = None


def _key(version: str) -> tuple[int, str]:
    return (int(version), version) if version.isdigit() else (1 << 62, version)


def read_models(model_root: Path, name: str, history: int = 10) -> ModelsView:
    """The versions of ``name`` under ``model_root``, newest first, with routing and the last
    ``history`` lifecycle changes."""
    lifecycle = ModelLifecycle(model_root, name)
    try:
        state = lifecycle.read()
    except CorruptLifecycleFile as error:
        return ModelsView(name, model_root, [], problem=error.message)
    versions = []
    for record in sorted(state.versions.values(), key=lambda r: _key(r.version), reverse=True):
        try:
            metadata, _ = repository.load(model_root, name, record.version)
        except (OSError, ValueError, ValidationError):  # listed, without its metadata
            metadata = None
        gates = record.gates
        versions.append(
            VersionView(
                version=record.version,
                state=record.state.value,
                since=record.since,
                traffic=state.traffic(record.version),
                reason=record.reason,
                metrics={k: metadata.metrics[k] for k, _ in METRICS if k in metadata.metrics}
                if metadata
                else {},
                review_threshold=metadata.thresholds.review if metadata else None,
                decline_threshold=metadata.thresholds.decline if metadata else None,
                created_at=metadata.created_at if metadata else None,
                gates_passed=gates.passed if gates is not None else None,
                gates=tuple(gates.checks) if gates is not None else (),
            )
        )
    routing = state.routing
    problem = None if versions else f"no version of {name!r} is published in {model_root}"
    try:
        rollout = RolloutFile(model_root, name).read()
    except CorruptLifecycleFile as error:
        rollout, problem = None, error.message
    return ModelsView(
        name=name,
        model_root=model_root,
        versions=versions,
        live=routing.live,
        canary=routing.canary.version if routing.canary else None,
        canary_percent=routing.canary.percent if routing.canary else None,
        shadow=routing.shadow,
        previous=routing.previous,
        generation=state.generation,
        history=list(reversed(state.history[-history:])) if history else [],
        rollout=rollout,
        problem=problem,
    )
