"""The gateway as a Service for the shared runtime: model versions, rules, channels, warm-up.

By default the gateway calls the feature service and the scorer over gRPC; with
``in_process`` it reads the online store and runs the model itself (``inprocess.py``).
Which model versions answer follows the lifecycle file (``rollout.py``), unless a version
is pinned in the settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import redis

from fraud.v1 import outcomes_pb2_grpc
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common.channels import insecure_channel
from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.eventlog import EventLogSettings, open_producer
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.controls import ListControl, ListFollower, PolicyControl, PolicyFollower
from services.gateway.dependencies import (
    GrpcFeatureClient,
    GrpcModelProvider,
)
from services.gateway.events import EventEmitter
from services.gateway.explain import LocalExplainerProvider
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Pipeline
from services.gateway.ports import FeatureClient, ModelExplainer, ModelProvider
from services.gateway.rollout import Rollout
from services.gateway.servicer import FraudScoringServicer, OutcomeServicer
from services.gateway.settings import GatewaySettings
from services.gateway.shadow import ShadowQueue, ShadowScorer
from services.gateway.smallmodel import LocalSmallModelProvider
from services.gateway.streams import StreamFeatureClient, StreamPool, stream_pools
from services.gateway.validate import Transaction
from services.models import repository
from services.models.lifecycle import ModelLifecycle
from services.models.policies import POLICY_DIR, PolicyStore

log = logging.getLogger(__name__)


class GatewayApp:
    """Answers fraud.v1.FraudScoring/Score through the feature service and the scorer, and
    fraud.v1.OutcomeService/ReportOutcome; both feed the event log (``events``)."""

    name = "gateway"

    def __init__(
        self,
        settings: GatewaySettings,
        store: FeatureStoreSettings | None = None,
        metrics: GatewayMetrics | None = None,
        events: EventLogSettings | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics or GatewayMetrics()
        # The producer connects lazily: a log backend that is down only means spilling.
        producer = (
            open_producer(events, journal=settings.journal)
            if events is not None and settings.emit_events
            else None
        )
        self.emitter = EventEmitter(producer, featurespec.MODEL_FEATURES, self.metrics)
        self.pipeline: Pipeline | None = None
        """The scoring pipeline, once ``start`` has built and warmed it."""
        self.servicer = FraudScoringServicer(
            lambda: self.pipeline,
            settings.budget_policy,
            settings.limits,
            self.metrics,
            settings.max_in_flight,
            self.emitter,
        )
        self.outcomes = OutcomeServicer(
            self.emitter, settings.limits, self.metrics, settings.outcome_delivery_timeout_s
        )
        self.channels: list[grpc.aio.Channel] = []
        self.rollout: Rollout | None = None
        self._closers: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._shadow: ShadowQueue | None = None
        self._pools: list[StreamPool[Any, Any]] = []
        self._followers: list[Callable[[], Coroutine[Any, Any, None]]] = []

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the public scoring and outcome servicers."""
        pb_grpc.add_FraudScoringServicer_to_server(self.servicer, server)
        outcomes_pb2_grpc.add_OutcomeServiceServicer_to_server(self.outcomes, server)
        return ["fraud.v1.FraudScoring", "fraud.v1.OutcomeService"]

    async def start(self) -> None:
        """Reads the lifecycle and rules, opens channels, readies and warms every routed
        version, then follows the lifecycle."""
        s = self.settings
        lifecycle = ModelLifecycle(s.models_path, s.model_name)
        metadata = self._live_metadata(lifecycle)
        # The rules see every feature the gateway computes, whichever version answers.
        rules = RulesEngine.load(s.rules_path or DEFAULT_RULES, featurespec.MODEL_FEATURES)
        policy = self._policy()
        lists = await self._lists()
        features, provider = await self._dependencies()
        # The scorer loads the live version by itself before it reports SERVING; asking it
        # here would only hold up a gateway started while the scorer is down.
        live_model = await provider.prepare(metadata, load=s.in_process)
        # Small models run here whatever the transport to the scorer: they answer when it cannot.
        small_provider = LocalSmallModelProvider(s.models_path)
        live_small = await small_provider.prepare(metadata)
        explainers, live_explainer = await self._explainers(metadata)
        self._shadow = ShadowQueue(
            ShadowScorer(self.metrics, s.shadow_policy, cascade=s.cascade).score,
            self.metrics.shadow_dropped.inc,
            s.shadow_policy,
        )
        pipeline = Pipeline(
            metadata,
            rules,
            features,
            live_model,
            self.metrics,
            self._breaker("features", s.features_slow_ms),
            self._breaker("scorer", s.scorer_slow_ms),
            canary_cap_s=s.canary_cap_ms / 1000,
            shadow_queue=self._shadow,
            small=live_small,
            cascade=s.cascade,
            controls=(*lists, policy.control),
            explainer=live_explainer,
            model_reasons=s.model_reasons,
        )
        self.rollout = Rollout(
            lifecycle,
            pipeline,
            provider,
            self.metrics,
            limits=s.canary_limits,
            new_breaker=lambda name: self._breaker(name, s.scorer_slow_ms),
            poll_s=s.lifecycle_poll_ms / 1000,
            actor=f"gateway:{s.port} pid {os.getpid()}@{socket.gethostname()}",
            pinned_version=s.model_version,
            small_provider=small_provider,
            explainer_provider=explainers,
        )
        await self.rollout.apply(self.rollout.read())
        await self._warm_up(pipeline)
        self._shadow.start()
        self.pipeline = pipeline
        self._tasks.append(asyncio.create_task(self.rollout.follow()))
        self._tasks.append(asyncio.create_task(policy.follow()))
        self._tasks += [asyncio.create_task(follow()) for follow in self._followers]
        self._log_ready(pipeline)

    async def _explainers(
        self, metadata: repository.ModelMetadata
    ) -> tuple[LocalExplainerProvider | None, ModelExplainer | None]:
        """What loads each routed version's trees for its model reasons, and the live
        version's; None, None when the model reasons are off."""
        if self.settings.model_reasons <= 0:
            return None, None
        provider = LocalExplainerProvider(self.settings.models_path)
        self._closers.append(provider.close)
        return provider, await provider.prepare(metadata)

    def _policy(self) -> PolicyFollower:
        """The fraud team's live policy, read now and followed once serving."""
        s = self.settings
        follower = PolicyFollower(
            PolicyStore(s.policy_dir or s.var_dir / POLICY_DIR),
            PolicyControl(),
            s.lifecycle_poll_ms / 1000,
        )
        follower.load()
        return follower

    async def _lists(self) -> tuple[ListControl, ...]:
        """The fraud team's lists from the online store, read now and followed once serving
        (none without the store's settings or its SQLite file)."""
        if self.store is None:
            return ()
        store_settings = self.store
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(
            None, lambda: open_lists(store_settings, timeout_s=1.0, reader=True)
        )
        if store is None:
            log.info(
                "no online store file: no lists", extra={"path": str(store_settings.online_file)}
            )
            return ()
        follower = ListFollower(store, ListControl(), self.settings.lifecycle_poll_ms / 1000)
        try:
            await loop.run_in_executor(None, follower.load)
        except (OSError, sqlite3.Error, redis.RedisError):
            # The model still answers while the store is down, as it did before lists
            # existed; the follower reads the lists as soon as the store answers.
            log.exception("cannot read the lists in the online store: serving without them")
        self._closers.append(store.close)
        self._followers.append(follower.follow)
        return (follower.control,)

    def _log_ready(self, pipeline: Pipeline) -> None:
        """Says what answers now."""
        routes = pipeline.routes
        log.info(
            "gateway ready",
            extra={
                "model": pipeline.metadata.name,
                "live": routes.live.version,
                "canary": routes.canary.version if routes.canary else None,
                "shadow": routes.shadow.version if routes.shadow else None,
                "rules": pipeline.rules.version,
                "in_process": self.settings.in_process,
                "small_model": routes.live.small is not None,
                "cascade": self.settings.cascade,
            },
        )

    def _live_metadata(self, lifecycle: ModelLifecycle) -> repository.ModelMetadata:
        """The metadata of the version that answers first (pinned, else live); refuses one
        that needs a feature nobody produces, naming it."""
        s = self.settings
        live_version = s.model_version or lifecycle.read().routing.live
        try:
            metadata, _ = repository.load(s.models_path, s.model_name, live_version)
        except FileNotFoundError as error:
            raise FailedPrecondition(str(error)) from error
        try:
            featurespec.input_positions(metadata.feature_order)
        except featurespec.UnservableFeatures as error:
            raise FailedPrecondition(
                f"model {metadata.name} v{metadata.version} cannot be served: {error}"
            ) from error
        return metadata

    async def _dependencies(self) -> tuple[FeatureClient, ModelProvider]:
        """The feature client and the model provider: in process, or over gRPC (unary calls
        or persistent streams, as the settings say)."""
        s = self.settings
        if s.in_process:
            return await self._in_process()
        features_channel = insecure_channel(s.features_target)
        scorer_channel = insecure_channel(s.scorer_target)
        self.channels = [features_channel, scorer_channel]
        await self._wait_ready([features_channel, scorer_channel])
        if s.transport == "stream":
            return await self._streams(features_channel, scorer_channel)
        return (
            GrpcFeatureClient(features_channel),
            GrpcModelProvider(scorer_channel, s.model_load_timeout_s),
        )

    async def _streams(
        self, features_channel: grpc.aio.Channel, scorer_channel: grpc.aio.Channel
    ) -> tuple[FeatureClient, ModelProvider]:
        """Clients over persistent streams; a traced request's context travels inside its
        stream message (``streams.StreamPool.request``), so its trace spans the services."""
        s = self.settings
        # Streams get channels of their own, without per-call tracing: a stream carries
        # many requests, of many traces.
        features_streams = insecure_channel(s.features_target, traced=False)
        scorer_streams = insecure_channel(s.scorer_target, traced=False)
        self.channels += [features_streams, scorer_streams]
        features_pool, scorer_pool = stream_pools(
            features_streams, scorer_streams, self.metrics, s.stream_settings
        )
        self._pools = [features_pool, scorer_pool]
        await self._wait_open(self._pools)
        features = StreamFeatureClient(features_pool)
        provider = GrpcModelProvider(scorer_channel, s.model_load_timeout_s, stream=scorer_pool)
        return features, provider

    async def _in_process(self) -> tuple[FeatureClient, ModelProvider]:
        """Opens the online store; model versions are loaded in this process."""
        # Imported here: Feast and ONNX Runtime stay out of a gateway that calls the services.
        from services.featurestore.online import OnlineFeatureReader
        from services.gateway.inprocess import LocalFeatureClient, LocalModelProvider

        s = self.settings
        if self.store is None:
            raise FailedPrecondition("in-process mode needs the feature store's settings")
        store_settings = self.store
        # A read blocks the event loop: bound it by the feature call's slice of the budget.
        timeout_ms = min(store_settings.redis_timeout_ms, s.features_cap_ms)
        store_settings = store_settings.model_copy(update={"redis_timeout_ms": timeout_ms})
        loop = asyncio.get_running_loop()
        reader = await loop.run_in_executor(None, OnlineFeatureReader, store_settings)
        features = LocalFeatureClient(reader)
        self._closers.append(features.close)
        return features, LocalModelProvider(s.models_path)

    def _breaker(self, dependency: str, slow_ms: float) -> CircuitBreaker:
        """A breaker for ``dependency`` whose state changes reach the metrics."""
        self.metrics.breaker_state.labels(dependency).set(0)
        return CircuitBreaker(
            dependency,
            self.settings.breaker_config(slow_ms),
            on_transition=self.metrics.breaker_transition,
        )

    async def _wait_ready(self, channels: list[grpc.aio.Channel]) -> None:
        """Connects the channels; dependencies still down later are covered by the fallbacks."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(c.channel_ready() for c in channels)),
                self.settings.dependency_wait_s,
            )
        except TimeoutError:
            log.warning("dependencies not reachable yet; serving with fallbacks until they are")

    async def _wait_open(self, pools: list[StreamPool[Any, Any]]) -> None:
        """Waits for a stream to each dependency; one still down later is covered by the
        fallbacks while its streams keep reopening."""
        opened = await asyncio.gather(
            *(p.wait_open(self.settings.dependency_wait_s) for p in pools)
        )
        if not all(opened):
            log.warning(
                "streams to dependencies not open yet; serving with fallbacks until they are"
            )

    async def _warm_up(self, pipeline: Pipeline) -> None:
        """Runs whole scoring calls so the first real request finds everything hot."""
        policy = self.settings.budget_policy
        tx = Transaction(
            "warmup", "warmup-card", "warmup-merchant", 1000, "EUR", time.time(), "", False
        )
        # A warm-up transaction may be a clear case: without the cascade it reaches the scorer.
        cascade, pipeline.cascade = pipeline.cascade, False
        try:
            for _ in range(self.settings.warmup_calls):
                await pipeline.score(tx, Budget(policy, None))
        finally:
            pipeline.cascade = cascade
        # First calls on fresh connections are slow; they must not count against the
        # dependencies once real traffic starts.
        pipeline.features_breaker.reset()
        pipeline.scorer_breaker.reset()

    async def close(self) -> None:
        """Stops following the lifecycle and the shadow workers, delivers the buffered events
        (the server has stopped: no more come), then closes the dependency channels."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._shadow is not None:
            await self._shadow.close()
            # Jobs ended by the close run their decision events' callbacks on the next turns
            # of the loop: let them append before the producer is flushed and closed.
            for _ in range(3):
                await asyncio.sleep(0)
        await self.emitter.close()
        for pool in self._pools:
            await pool.close()
        for channel in self.channels:
            await channel.close()
        for close in self._closers:
            close()
