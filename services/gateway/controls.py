"""The fraud team's lists and policy as controls of the ladder's first rung, followed at run
time.

``ListControl`` declines a payment whose card, card prefix, merchant or terminal is on the
block list, and approves one on the allow list, from an in-memory index; ``ListFollower``
polls the lists' generation in the online store and reads the entries again only when it
moved. Both followers keep what they hold when a read fails.

``PolicyControl`` holds the compiled live policy (or none) and decides a call by its first
live rule that fires; it also notes, on every call, the shadow rules that fire, for the
decision event. ``PolicyFollower`` stats the store's state file every poll and swaps in the
newly live policy in one assignment, so every replica follows a change within a poll without
a restart; a policy it cannot read leaves the current one answering (docs/controls.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from services.common.errors import FailedPrecondition
from services.common.polling import poll_forever
from services.domain import featurespec
from services.domain.lists import ListIndex, ListName
from services.domain.policy import ACTION_SCORE, Action, Policy, PolicyError, payment_of
from services.featurestore.lists import ListStore
from services.gateway.decision import Decision
from services.gateway.pipeline import Call, Outright, ThresholdOverride
from services.models.lifecycle import FileKey
from services.models.policies import PolicyStore

log = logging.getLogger(__name__)

_DECISION = {
    Action.DECLINE: Decision.DECLINE,
    Action.REVIEW: Decision.REVIEW,
    Action.APPROVE: Decision.APPROVE,
}

_NO_FEATURES: Mapping[str, float] = {}


def policy_version(policy: Policy) -> str:
    """The ``model_version`` of an answer a rule of ``policy`` decided."""
    return f"policy-{policy.version}"


class PolicyControl:
    """Decides a call by the live policy's first firing rule; notes its shadow rules."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy
        """The live policy; None answers nothing (the ladder goes on as without a policy)."""

    def decide(self, call: Call) -> Outright | None:
        """The first live rule's decision on ``call``, or None; shadow rules are noted in
        ``call.shadow_rules`` either way."""
        policy = self.policy
        if policy is None:
            return None
        tx = call.tx
        payment = payment_of(
            tx.card_id,
            tx.merchant_id,
            tx.terminal_id,
            tx.amount_minor,
            tx.currency,
            tx.card_not_present,
        )
        features = (
            dict(zip(featurespec.SERVABLE_FEATURES, call.inputs, strict=False))
            if policy.uses_features
            else _NO_FEATURES
        )
        own = policy.thresholds_for(tx.merchant_id, features)
        if own is not None:
            call.thresholds = ThresholdOverride(own[0], own[1], policy_version(policy))
        if policy.shadow:
            call.shadow_rules = policy.shadowed(payment, features)
        rule = policy.decide(payment, features)
        if rule is None:
            return None
        return Outright(
            _DECISION[rule.action],
            ACTION_SCORE[rule.action],
            f"rule {rule.name}: {rule.reason}",
            policy_version(policy),
        )


class PolicyFollower:
    """Keeps a ``PolicyControl`` in step with the store's live version."""

    def __init__(self, store: PolicyStore, control: PolicyControl, poll_s: float) -> None:
        self.store = store
        self.control = control
        self._poll_s = poll_s
        self._key: FileKey | None = None

    def load(self) -> None:
        """Reads the live policy now (at start-up: a bad store fails the start, by name)."""
        self._key = self.store.file_key()
        try:
            self.control.policy = self.store.live()
        except PolicyError as error:
            raise FailedPrecondition(f"live policy: {error}") from error

    async def follow(self) -> None:
        """Polls the state file until cancelled; the policy live before keeps answering
        while a change cannot be read."""
        await poll_forever(self._poll_s, self.check, log, "cannot follow the policy")

    async def check(self) -> None:
        """One poll: applies a changed state file."""
        key = self.store.file_key()
        if key == self._key:
            return
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(None, self.store.read_state)
        current = self.control.policy
        if (current.version if current is not None else None) != state.live:
            policy = await loop.run_in_executor(None, self.store.live)
            self.control.policy = policy
            log.info("policy changed", extra={"policy": policy.version if policy else None})
        # Only once applied: a file that could not be read is read again at the next poll.
        self._key = key


_LIST_DECISION = {ListName.BLOCK: Decision.DECLINE, ListName.ALLOW: Decision.APPROVE}
_LIST_SCORE = {ListName.BLOCK: 1.0, ListName.ALLOW: 0.0}


class ListControl:
    """Decides a call whose card, card prefix, merchant or terminal is on a list."""

    def __init__(
        self, index: ListIndex | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.index = index
        """Every entry; None (or empty) answers nothing."""
        self._clock = clock

    def decide(self, call: Call) -> Outright | None:
        """A live block entry declines, else a live allow entry approves, else None."""
        index = self.index
        if index is None:
            return None
        tx = call.tx
        entry = index.match(tx.card_id, tx.merchant_id, tx.terminal_id, self._clock())
        if entry is None:
            return None
        return Outright(
            _LIST_DECISION[entry.list],
            _LIST_SCORE[entry.list],
            f"{entry.list.value} list: {entry.kind.value} {entry.value}: {entry.reason}",
            f"lists-{index.generation}",
        )


class ListFollower:
    """Keeps a ``ListControl`` in step with the lists in the online store."""

    def __init__(self, store: ListStore, control: ListControl, poll_s: float) -> None:
        self.store = store
        self.control = control
        self._poll_s = poll_s

    def load(self) -> None:
        """Reads every entry now."""
        generation, entries = self.store.entries()
        self.control.index = ListIndex(entries, generation)

    async def follow(self) -> None:
        """Polls the lists' generation until cancelled; the entries read before keep
        answering, and a store that stays down is logged once, not every poll."""
        await poll_forever(self._poll_s, self.check, log, "cannot follow the lists", log_once=True)

    async def check(self) -> None:
        """One poll: reads the entries again when their generation moved."""
        loop = asyncio.get_running_loop()
        generation = await loop.run_in_executor(None, self.store.generation)
        current = self.control.index
        if current is not None and current.generation == generation:
            return
        generation, entries = await loop.run_in_executor(None, self.store.entries)
        self.control.index = ListIndex(entries, generation)
        log.info("lists changed", extra={"generation": generation, "entries": len(entries)})
