"""The gateway as a Service for the shared runtime: model metadata, rules, channels, warm-up.

By default the gateway calls the feature service and the scorer over gRPC; with
``in_process`` it reads the online store and runs the model itself (``inprocess.py``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from fraud.v1 import outcomes_pb2_grpc
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common.channels import insecure_channel
from services.common.errors import FailedPrecondition
from services.domain import featurespec
from services.domain.rules import DEFAULT_RULES, RulesEngine
from services.eventlog import EventLogSettings, open_producer
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.dependencies import GrpcFeatureClient, GrpcModelClient
from services.gateway.events import EventEmitter
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import FeatureClient, ModelClient, Pipeline
from services.gateway.servicer import FraudScoringServicer, OutcomeServicer
from services.gateway.settings import GatewaySettings
from services.gateway.validate import Transaction
from services.models import repository

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
        producer = open_producer(events) if events is not None and settings.emit_events else None
        self.emitter = EventEmitter(producer, featurespec.MODEL_FEATURES, self.metrics)
        self.servicer = FraudScoringServicer(
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
        self._closers: list[Callable[[], None]] = []

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the public scoring and outcome servicers."""
        pb_grpc.add_FraudScoringServicer_to_server(self.servicer, server)
        outcomes_pb2_grpc.add_OutcomeServiceServicer_to_server(self.outcomes, server)
        return ["fraud.v1.FraudScoring", "fraud.v1.OutcomeService"]

    async def start(self) -> None:
        """Loads model metadata and rules, opens channels, waits for and warms the dependencies."""
        s = self.settings
        try:
            metadata, _ = repository.load(s.models_path, s.model_name, s.model_version)
        except FileNotFoundError as error:
            raise FailedPrecondition(str(error)) from error
        if tuple(metadata.feature_order) != tuple(featurespec.MODEL_FEATURES):
            raise FailedPrecondition(
                f"model {metadata.name} v{metadata.version} expects features "
                f"{metadata.feature_order}, this gateway computes {featurespec.MODEL_FEATURES}"
            )
        rules = RulesEngine.load(s.rules_path or DEFAULT_RULES, metadata.feature_order)
        features: FeatureClient
        model: ModelClient
        if s.in_process:
            features, model = await self._in_process(metadata)
        else:
            features_channel = insecure_channel(s.features_target)
            scorer_channel = insecure_channel(s.scorer_target)
            self.channels = [features_channel, scorer_channel]
            await self._wait_ready([features_channel, scorer_channel])
            features = GrpcFeatureClient(features_channel)
            model = GrpcModelClient(scorer_channel, metadata)
        pipeline = Pipeline(
            metadata,
            rules,
            features,
            model,
            self.metrics,
            self._breaker("features", s.features_slow_ms),
            self._breaker("scorer", s.scorer_slow_ms),
        )
        await self._warm_up(pipeline)
        self.servicer.pipeline = pipeline
        log.info(
            "gateway ready",
            extra={
                "model": metadata.name,
                "version": metadata.version,
                "rules": rules.version,
                "in_process": s.in_process,
            },
        )

    async def _in_process(
        self, metadata: repository.ModelMetadata
    ) -> tuple[FeatureClient, ModelClient]:
        """Opens the online store and loads the ONNX model of ``metadata`` in this process."""
        # Imported here: Feast and ONNX Runtime stay out of a gateway that calls the services.
        from services.featurestore.online import OnlineFeatureReader
        from services.gateway.inprocess import LocalFeatureClient, LocalModelClient
        from services.models.onnx import OnnxModel

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
        model = await loop.run_in_executor(
            None, OnnxModel.load, s.models_path, metadata.name, metadata.version
        )
        return features, LocalModelClient(model)

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

    async def _warm_up(self, pipeline: Pipeline) -> None:
        """Runs whole scoring calls so the first real request finds everything hot."""
        policy = self.settings.budget_policy
        tx = Transaction(
            "warmup", "warmup-card", "warmup-merchant", 1000, "EUR", time.time(), "", False
        )
        for _ in range(self.settings.warmup_calls):
            await pipeline.score(tx, Budget(policy, None))
        # First calls on fresh connections are slow; they must not count against the
        # dependencies once real traffic starts.
        pipeline.features_breaker.reset()
        pipeline.scorer_breaker.reset()

    async def close(self) -> None:
        """Delivers the buffered events (the server has stopped: no more come), then closes
        the dependency channels."""
        await self.emitter.close()
        for channel in self.channels:
            await channel.close()
        for close in self._closers:
            close()
