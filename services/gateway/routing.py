"""Which model version answers a transaction: the live one, or the canary for its cards.

A ``RouteTable`` is an immutable snapshot of the routing the lifecycle file describes,
with a ready client per version. The gateway swaps the whole table in one assignment
when the routing changes, so a call sees one consistent routing from start to end.

A card goes to the canary when its bucket (a stable hash of the card id, modulo 10,000)
is below the canary's share in hundredths of a percent: the same card always gets the
same version while the canary lasts, on every gateway replica, and raising the share
only adds cards to the canary.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.domain import featurespec
from services.gateway.breaker import CircuitBreaker
from services.gateway.canary import CanaryWatch
from services.gateway.ports import Arm, ModelClient, ModelExplainer, SmallModelClient
from services.gateway.validate import Transaction
from services.models.lifecycle import CANARY_BUCKETS
from services.models.repository import ModelMetadata, Thresholds


def card_bucket(card_id: str) -> int:
    """The card's canary bucket in [0, CANARY_BUCKETS): stable across processes and runs."""
    digest = hashlib.blake2b(card_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % CANARY_BUCKETS


@dataclass(frozen=True, slots=True, eq=False)
class ModelRoute:
    """One servable version: what the gateway needs to score and decide with it.

    Its input follows its own ``feature_order``: any selection of the features the mesh can
    produce (``featurespec.SERVABLE_FEATURES``); building a route for a version that names
    another raises ``featurespec.UnservableFeatures`` naming it."""

    metadata: ModelMetadata
    client: ModelClient
    small: SmallModelClient | None = None
    """The version's small model, loaded here (None: the version has none, or it could not
    be loaded): the cascade's first stage and the first fallback."""
    explainer: ModelExplainer | None = None
    """The version's own trees, loaded here for the reasons of its model answers (None: the
    version keeps no booster text, or it could not be loaded)."""
    order: tuple[str, ...] = field(init=False)
    positions: tuple[int, ...] | None = field(init=False)
    """Where each input of ``order`` sits in ``SERVABLE_FEATURES``; None for the code's own
    ``MODEL_FEATURES`` order, whose vector is used as computed (no copy)."""
    helpers: bool = field(init=False)
    """Whether the version takes one of the store's helper features as an input."""
    defaults: Mapping[str, float] = field(init=False)
    clear_approve: float = field(init=False)
    """Below this small-model score the cascade approves (0 without a small model)."""
    small_thresholds: Thresholds | None = field(init=False)
    """The small model's own thresholds, for when it answers alone."""

    def __post_init__(self) -> None:
        order = tuple(self.metadata.feature_order)
        positions = featurespec.input_positions(order)
        helpers = positions is not None and max(positions, default=0) >= _MODEL_WIDTH
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "helpers", helpers)
        # A feature the version does not take is still computed for the rules; without a
        # default of the version's it is unknown (NaN: no comparison on it holds).
        computed = featurespec.SERVABLE_FEATURES if helpers else featurespec.MODEL_FEATURES
        own = self.metadata.default_features
        defaults = {name: own.get(name, math.nan) for name in computed}
        object.__setattr__(self, "defaults", defaults)
        info = self.metadata.small_model if self.small is not None else None
        object.__setattr__(self, "clear_approve", info.clear_approve if info else 0.0)
        object.__setattr__(self, "small_thresholds", info.thresholds if info else None)

    @property
    def version(self) -> str:
        """The model version."""
        return self.metadata.version

    @property
    def thresholds(self) -> Thresholds:
        """Its decision thresholds."""
        return self.metadata.thresholds

    def inputs(
        self, tx: Transaction, store: Mapping[str, float | None]
    ) -> tuple[list[float], list[float]]:
        """Every computed feature for ``tx`` (``SERVABLE_FEATURES`` order, helpers only when
        the version takes one) and, from them, this version's input in its own order: the
        same list when its order is ``MODEL_FEATURES``."""
        computed = featurespec.model_vector(
            store,
            amount_minor=tx.amount_minor,
            currency=tx.currency,
            timestamp_s=tx.timestamp_s,
            card_not_present=tx.card_not_present,
            defaults=self.defaults,
            helpers=self.helpers,
        )
        positions = self.positions
        if positions is None:
            return computed, computed
        return computed, [computed[i] for i in positions]

    def vector(self, tx: Transaction, store: Mapping[str, float | None]) -> list[float]:
        """This version's input for ``tx``, in its own feature order: the store's features
        (its defaults for the missing ones) and the request-time features."""
        return self.inputs(tx, store)[1]

    def warm_up_vector(self) -> list[float]:
        """An input of this version for warm-up calls: a payment of a card the store does
        not know."""
        tx = Transaction("warmup", "", "", 1000, "EUR", time.time(), "", False)
        return self.vector(tx, {})


_MODEL_WIDTH = len(featurespec.MODEL_FEATURES)


@dataclass(frozen=True, slots=True, eq=False)
class RouteTable:
    """The versions answering now: live for every card, canary for its share of cards."""

    live: ModelRoute
    canary: ModelRoute | None = None
    canary_buckets: int = 0
    """Cards whose bucket is below this go to the canary."""
    canary_breaker: CircuitBreaker | None = None
    """The canary's own breaker: its failures never open the live model's breaker."""
    watch: CanaryWatch | None = None
    """Compares the canary with live while a canary runs."""
    shadow: ModelRoute | None = None
    generation: int = 0
    """Generation of the lifecycle file this table follows."""

    def pick(self, card_id: str) -> tuple[ModelRoute, Arm]:
        """The version that answers for ``card_id``, and its arm."""
        canary = self.canary
        if canary is not None and card_bucket(card_id) < self.canary_buckets:
            return canary, Arm.CANARY
        return self.live, Arm.LIVE

    def versions(self) -> dict[str, ModelRoute]:
        """Every version in the table by version."""
        routes = [self.live, self.canary, self.shadow]
        return {r.version: r for r in routes if r is not None}
