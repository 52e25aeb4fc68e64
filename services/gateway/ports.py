"""The gateway's ports: what the scoring pipeline asks of its dependencies, and how a failure
behind one of them reads.

The pipeline, the rollout and the canary watch depend on these and nothing else of the
dependencies; the adapters (gRPC unary in ``dependencies.py``, persistent streams in
``streams.py``, in process in ``inprocess.py``, a version's small model in
``smallmodel.py``) implement them. Transport-free: nothing here
imports grpc, so the domain modules that use it stay testable without a server.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

from services.models.explain import Explanation
from services.models.repository import ModelMetadata

__all__ = [
    "STATUS_NAMES",
    "Arm",
    "BatchModelClient",
    "DependencyError",
    "ExplainerProvider",
    "FeatureClient",
    "ModelClient",
    "ModelExplainer",
    "ModelProvider",
    "SmallModelClient",
    "SmallModelProvider",
    "status_reason",
]


class Arm(enum.Enum):
    """Which arm of the routing answered: the live version, or the canary for its cards."""

    LIVE = "live"
    CANARY = "canary"


class DependencyError(Exception):
    """A downstream call failed; ``reason`` is a short label (timeout, unavailable, …)."""

    def __init__(self, dependency: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{dependency}: {reason} {detail}".strip())
        self.dependency = dependency
        self.reason = reason


STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
"""The gRPC status names, indexed by their code number (the same in ``grpc.StatusCode`` and
``google.rpc.Code``)."""

# OK is left out: a failure that claims it is as unexplained as one with no status at all.
_REASONS = {name: name.lower() for name in STATUS_NAMES[1:]} | {"DEADLINE_EXCEEDED": "timeout"}


def status_reason(status: str | int) -> str:
    """The ``reason`` of a dependency that failed with gRPC status ``status`` (its name or its
    number), the same whichever transport carried it (unary calls, streams): the name in
    lower case, ``timeout`` for DEADLINE_EXCEEDED (the label of a deadline the gateway
    enforces itself too), ``unknown`` for anything that is not an error status."""
    if isinstance(status, int):
        status = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "UNKNOWN"
    return _REASONS.get(status, "unknown")


class FeatureClient(Protocol):
    """Reads store features; None marks a missing or stale value."""

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        """Raises DependencyError when the feature service cannot answer in time; the
        terminal's features are missing when ``terminal_id`` is empty."""
        ...


class ModelClient(Protocol):
    """Scores one model feature vector."""

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability; raises DependencyError when the model cannot answer in time."""
        ...


class BatchModelClient(ModelClient, Protocol):
    """A model client that can also score several vectors in one call."""

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        """Fraud probability of each vector; raises DependencyError like ``score``."""
        ...


class ModelProvider(Protocol):
    """Makes a model version ready to score and returns a client for it."""

    async def prepare(self, metadata: ModelMetadata, load: bool = True) -> ModelClient:
        """A client scoring with this version; with ``load``, returns once the version is
        loaded where it runs. Raises when it cannot be made ready."""
        ...


class SmallModelClient(Protocol):
    """A version's small model, run in the gateway's own process: no I/O, no deadline."""

    def score(self, vector: list[float]) -> float:
        """Fraud probability of one model feature vector; raises on its own failure."""
        ...


class SmallModelProvider(Protocol):
    """Loads a version's small model into the gateway's process."""

    async def prepare(self, metadata: ModelMetadata) -> SmallModelClient | None:
        """A ready (loaded and warmed) small model of this version, or None when the version
        has none or it cannot be loaded (logged): the version then runs without a cascade
        and the rules are its only fallback."""
        ...


class ModelExplainer(Protocol):
    """A version's own trees in the gateway's process: the exact TreeSHAP contributions of
    one input to the model's raw score (``services.models.explain``)."""

    async def explain(self, vector: list[float], timeout_s: float) -> Explanation:
        """The explanation of ``vector``; raises DependencyError (``busy``, ``timeout``,
        ``error``) when it cannot be given within ``timeout_s``."""
        ...


class ExplainerProvider(Protocol):
    """Loads a version's trees into the gateway's process for its answers' reasons."""

    async def prepare(self, metadata: ModelMetadata) -> ModelExplainer | None:
        """A ready explainer of this version, or None when the version keeps no booster text
        or it cannot be loaded (logged): its answers then carry the threshold-written reasons."""
        ...
