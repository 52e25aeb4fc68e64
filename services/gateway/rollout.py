"""The gateway follows the model lifecycle: routing changes at run time, automatic rollback.

Every ``poll_s`` the gateway stats the lifecycle file (``routing.json`` beside the models;
one ``stat`` call). When it changed, the gateway reads it, makes every version it routes
to ready (metadata read, version loaded in the scorer and warmed, a client built) while
the current route table keeps answering, then swaps in the new table in one assignment.
Every replica does the same, so a change reaches all of them within one poll plus the
load of a version none had yet, and a restarted gateway starts from the file.

While a canary runs, the same loop asks the canary watch for a breach. On one, this
gateway stops routing cards to the canary at once and writes the rollback into the file,
conditional on the generation it routed by; when several gateways see the breach, one
write wins and the others find the canary gone at their next read.

Transport-free: versions are made ready by an injected ``ModelProvider`` (gRPC to the
scorer, or ONNX Runtime in process).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from services.common.polling import poll_forever
from services.domain import featurespec
from services.gateway.breaker import CircuitBreaker
from services.gateway.canary import CanaryLimits, CanaryWatch
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Pipeline
from services.gateway.ports import ExplainerProvider, ModelProvider, SmallModelProvider
from services.gateway.routing import ModelRoute, RouteTable
from services.models import repository
from services.models.lifecycle import FileKey, LifecycleState, ModelLifecycle

log = logging.getLogger(__name__)


class Rollout:
    """Keeps a pipeline's route table in step with the lifecycle file."""

    def __init__(
        self,
        lifecycle: ModelLifecycle,
        pipeline: Pipeline,
        provider: ModelProvider,
        metrics: GatewayMetrics,
        *,
        limits: CanaryLimits,
        new_breaker: Callable[[str], CircuitBreaker],
        poll_s: float,
        retry_s: float = 1.0,
        warmup_calls: int = 5,
        actor: str = "gateway",
        pinned_version: str | None = None,
        small_provider: SmallModelProvider | None = None,
        explainer_provider: ExplainerProvider | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.pipeline = pipeline
        self.provider = provider
        self.metrics = metrics
        self.limits = limits
        self._new_breaker = new_breaker
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._warmup_calls = warmup_calls
        self._actor = actor
        self._pinned = pinned_version
        self._small_provider = small_provider
        self._explainer_provider = explainer_provider
        self._key: FileKey | None = None
        self._retry_at: float | None = None
        self._breached: dict[str, str] = {}

    # Start-up ---------------------------------------------------------------------------

    def read(self) -> LifecycleState:
        """The lifecycle as it is now (the migrated view when no file exists yet)."""
        self._key = self.lifecycle.file_key()
        return self.lifecycle.read()

    def live_version(self, state: LifecycleState) -> str | None:
        """The version that answers every card not in a canary: pinned, else live."""
        return self._pinned or state.routing.live

    # Following --------------------------------------------------------------------------

    async def follow(self) -> None:
        """Polls the lifecycle file and the canary watch until cancelled."""
        await poll_forever(self._poll_s, self.check, log, "cannot follow the model lifecycle")

    async def check(self) -> None:
        """One poll: apply a changed lifecycle file, judge a running canary."""
        key = self.lifecycle.file_key()
        retry = self._retry_at is not None and time.monotonic() >= self._retry_at
        if key != self._key or retry:
            loop = asyncio.get_running_loop()
            state = await loop.run_in_executor(None, self.lifecycle.read)
            self._key = key
            await self.apply(state)
        await self._judge_canary()

    async def apply(self, state: LifecycleState) -> None:
        """Makes ready every version ``state`` routes to, then swaps the route table."""
        current = self.pipeline.routes
        known = current.versions()
        incomplete = False

        async def ready(version: str) -> ModelRoute | None:
            nonlocal incomplete
            if version in known:
                return known[version]
            route = await self._prepare(version)
            if route is None:
                incomplete = True
            else:
                known[version] = route
            return route

        routing = state.routing
        live_version = self.live_version(state)
        live = await ready(live_version) if live_version else None
        canary = shadow = None
        buckets = 0
        if not self._pinned:
            wanted = routing.canary
            if wanted is not None and wanted.version in self._breached:
                # A rollback this gateway detected but could not write yet: retry it with
                # the generation just read, and route nothing to the canary meanwhile.
                await self._write_rollback(
                    wanted.version, state.generation, self._breached[wanted.version]
                )
                incomplete = True
            elif wanted is not None:
                canary = await ready(wanted.version)
                buckets = wanted.buckets
            if routing.shadow:
                shadow = await ready(routing.shadow)
        if live is None:
            live = current.live
            if live_version is not None:
                incomplete = True
        table = self._table(current, live, canary, buckets, shadow, state.generation)
        self.pipeline.routes = table
        self._retry_at = time.monotonic() + self._retry_s if incomplete else None
        self.metrics.routing_generation.set(state.generation)
        self.metrics.canary_percent.set(buckets / 100 if canary is not None else 0)
        if _describe(current) != _describe(table):
            log.info(
                "routing changed",
                extra={"generation": state.generation, "routes": _describe(table)},
            )

    def _table(
        self,
        current: RouteTable,
        live: ModelRoute,
        canary: ModelRoute | None,
        buckets: int,
        shadow: ModelRoute | None,
        generation: int,
    ) -> RouteTable:
        """The route table of these versions; a canary that keeps running keeps its breaker
        and its watch."""
        same_canary = (
            canary is not None
            and current.canary is not None
            and current.canary.version == canary.version
        )
        return RouteTable(
            live=live,
            canary=canary,
            canary_buckets=buckets if canary is not None else 0,
            canary_breaker=(
                current.canary_breaker
                if same_canary
                else (self._new_breaker(f"canary-{canary.version}") if canary else None)
            ),
            watch=(
                current.watch
                if same_canary
                else (
                    CanaryWatch(canary.version, self.limits, self.pipeline.canary_cap_s)
                    if canary
                    else None
                )
            ),
            shadow=shadow,
            generation=generation,
        )

    async def _prepare(self, version: str) -> ModelRoute | None:
        """Metadata, a loaded and warmed client for ``version``; None (logged) if not ready."""
        loop = asyncio.get_running_loop()
        try:
            metadata, _ = await loop.run_in_executor(
                None, repository.load, self.lifecycle.model_root, self.lifecycle.name, version
            )
        except FileNotFoundError:
            log.exception("cannot read a routed model version", extra={"version": version})
            return None
        try:
            featurespec.input_positions(metadata.feature_order)
        except featurespec.UnservableFeatures as error:
            log.error(
                "routed model version needs features nobody produces; not routing to it",
                extra={"version": version, "unservable": error.names, "reason": str(error)},
            )
            return None
        started = time.perf_counter()
        try:
            client = await self.provider.prepare(metadata)
        except Exception:
            log.exception("cannot make a routed model version ready", extra={"version": version})
            return None
        vector = ModelRoute(metadata, client).warm_up_vector()
        for _ in range(self._warmup_calls):
            try:
                await client.score(vector, 1.0)
            except Exception:
                log.warning("warm-up call failed", extra={"version": version}, exc_info=True)
                break
        small = explainer = None
        if self._small_provider is not None:
            small = await self._small_provider.prepare(metadata)
        if self._explainer_provider is not None:
            explainer = await self._explainer_provider.prepare(metadata)
        log.info(
            "model version ready",
            extra={
                "version": version,
                "seconds": round(time.perf_counter() - started, 3),
                "small_model": small is not None,
                "model_reasons": explainer is not None,
            },
        )
        return ModelRoute(metadata, client, small, explainer)

    # Automatic rollback -----------------------------------------------------------------

    async def _judge_canary(self) -> None:
        table = self.pipeline.routes
        watch, canary = table.watch, table.canary
        if watch is None or canary is None:
            return
        reason = watch.breach()
        if reason is None:
            return
        version = canary.version
        self.metrics.canary_breaches.labels(version).inc()
        log.warning("canary breach", extra={"version": version, "reason": reason})
        self._breached[version] = reason
        # Stop sending cards to it here at once; the file follows.
        self.pipeline.routes = dataclasses.replace(
            table, canary=None, canary_buckets=0, canary_breaker=None, watch=None
        )
        self.metrics.canary_percent.set(0)
        await self._write_rollback(version, table.generation, reason)

    async def _write_rollback(self, version: str, generation: int, reason: str) -> None:
        loop = asyncio.get_running_loop()
        change = await loop.run_in_executor(
            None, self.lifecycle.abort_canary, version, generation, reason, self._actor
        )
        if change is not None:
            self.metrics.canary_rollbacks.labels(version).inc()
            log.warning(
                "automatic rollback written",
                extra={"version": version, "generation": change.generation, "reason": reason},
            )
            self._breached.pop(version, None)
        else:
            state = await loop.run_in_executor(None, self.lifecycle.read)
            canary = state.routing.canary
            if canary is None or canary.version != version:
                # Another gateway wrote it, or an operator changed the canary meanwhile.
                self._breached.pop(version, None)
        # Read the file at the next poll whatever happened.
        self._key = None


def _describe(table: RouteTable) -> dict[str, object]:
    return {
        "live": table.live.version,
        "canary": table.canary.version if table.canary else None,
        "canary_percent": table.canary_buckets / 100 if table.canary else 0,
        "shadow": table.shadow.version if table.shadow else None,
    }
