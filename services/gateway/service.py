"""The gateway as a Service for the shared runtime: model metadata, rules, channels, warm-up."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.common import featurespec, registry
from services.common.channels import insecure_channel
from services.common.errors import FailedPrecondition
from services.gateway.breaker import CircuitBreaker
from services.gateway.budget import Budget
from services.gateway.clients import GrpcFeatureClient, GrpcModelClient
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Pipeline
from services.gateway.rules import DEFAULT_RULES, RulesEngine
from services.gateway.servicer import FraudScoringServicer
from services.gateway.settings import GatewaySettings
from services.gateway.validate import Transaction

log = logging.getLogger(__name__)


class GatewayService:
    """Answers fraud.v1.FraudScoring/Score through the feature service and the scorer."""

    name = "gateway"

    def __init__(self, settings: GatewaySettings, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.servicer = FraudScoringServicer(
            settings.budget_policy, settings.limits, self.metrics, settings.max_in_flight
        )
        self.channels: list[grpc.aio.Channel] = []

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the public scoring servicer."""
        pb_grpc.add_FraudScoringServicer_to_server(self.servicer, server)
        return ["fraud.v1.FraudScoring"]

    async def start(self) -> None:
        """Loads model metadata and rules, opens channels, waits for and warms the dependencies."""
        s = self.settings
        try:
            metadata, _ = registry.load(s.models_path, s.model_name, s.model_version)
        except FileNotFoundError as error:
            raise FailedPrecondition(str(error)) from error
        if tuple(metadata.feature_order) != tuple(featurespec.MODEL_FEATURES):
            raise FailedPrecondition(
                f"model {metadata.name} v{metadata.version} expects features "
                f"{metadata.feature_order}, this gateway computes {featurespec.MODEL_FEATURES}"
            )
        rules = RulesEngine.load(s.rules_path or DEFAULT_RULES, metadata.feature_order)
        features_channel = insecure_channel(s.features_target)
        scorer_channel = insecure_channel(s.scorer_target)
        self.channels = [features_channel, scorer_channel]
        await self._wait_ready([features_channel, scorer_channel])
        pipeline = Pipeline(
            metadata,
            rules,
            GrpcFeatureClient(features_channel),
            GrpcModelClient(scorer_channel, metadata),
            self.metrics,
            self._breaker("features", s.features_slow_ms),
            self._breaker("scorer", s.scorer_slow_ms),
        )
        await self._warm_up(pipeline)
        self.servicer.pipeline = pipeline
        log.info(
            "gateway ready",
            extra={"model": metadata.name, "version": metadata.version, "rules": rules.version},
        )

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
        """Closes the dependency channels."""
        for channel in self.channels:
            await channel.close()
