"""The feature service as a Service for the shared runtime: connect the store, warm, serve."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from fraud.v1 import features_pb2_grpc as pb_grpc
from services.common.errors import Unavailable
from services.domain import featurespec
from services.features.servicer import FeatureServicer
from services.features.settings import FeaturesSettings
from services.featurestore.online import OnlineFeatureReader
from services.featurestore.settings import FeatureStoreSettings

log = logging.getLogger(__name__)

WARMUP_READS = 20
WARMUP_RETRY_S = 0.5
"""First wait before a warm-up read the online store did not answer is tried again."""
WARMUP_RETRY_MAX_S = 5.0
"""Longest wait between warm-up tries (the wait doubles from ``WARMUP_RETRY_S``)."""


class FeaturesApp:
    """Serves the model's store-backed features from the Feast online store."""

    name = "features"

    def __init__(self, settings: FeaturesSettings, store: FeatureStoreSettings) -> None:
        self.settings = settings
        self.store = store
        self.executor = ThreadPoolExecutor(
            max_workers=settings.read_threads, thread_name_prefix="feast-read"
        )
        self.servicer = FeatureServicer(
            featurespec.STORE_FEATURES,
            self.executor if settings.read_in_thread else None,
            observe=settings.observe_rpcs,
        )
        self.reader: OnlineFeatureReader | None = None

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the feature servicer."""
        pb_grpc.add_FeatureServiceServicer_to_server(self.servicer, server)
        return ["fraud.v1.FeatureService"]

    async def start(self) -> None:
        """Opens the Feast store and makes warm-up reads before serving."""
        loop = asyncio.get_running_loop()
        reader = await loop.run_in_executor(self.executor, OnlineFeatureReader, self.store)
        await self._warm(reader)
        self.reader = reader
        self.servicer.read_many = reader.read_many
        self.servicer.read = reader.read
        log.info("feature store ready", extra={"store": self.store.store})

    async def _warm(self, reader: OnlineFeatureReader) -> None:
        """Makes ``WARMUP_READS`` reads. A store that does not answer one (Redis still
        starting, or too slow on a loaded node) is waited for, the wait doubling up to
        ``WARMUP_RETRY_MAX_S``: the service stays not ready meanwhile instead of exiting, so
        that a slow store at start does not become a restart loop."""
        loop = asyncio.get_running_loop()
        done, wait = 0, WARMUP_RETRY_S
        while done < WARMUP_READS:
            try:
                await loop.run_in_executor(
                    self.executor, reader.read, "warmup-card", "warmup-m", time.time()
                )
            except Unavailable as error:
                log.warning(
                    "the online store did not answer a warm-up read; trying again",
                    extra={"error": error.message, "retry_in_s": wait},
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, WARMUP_RETRY_MAX_S)
                continue
            done += 1

    async def close(self) -> None:
        """Closes the store and the read threads."""
        if self.reader is not None:
            self.reader.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
