"""FeatureService servicer: request proto in, online-store read, feature vector proto out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from fraud.v1 import features_pb2 as pb
from fraud.v1 import features_pb2_grpc as pb_grpc
from services.common.errors import Unavailable
from services.domain.featurespec import FeatureRead
from services.domain.validation import check_id

Reader = Callable[[str, str, float, str], Sequence[FeatureRead]]
"""Reads (card_id, merchant_id, as_of_s, terminal_id) → one FeatureRead per store feature."""


class FeatureServicer(pb_grpc.FeatureServiceServicer):
    """Reads one card's, merchant's and terminal's features; unknown entities come back MISSING."""

    def __init__(self, names: Sequence[str], executor: ThreadPoolExecutor | None) -> None:
        self._names = tuple(names)
        self._executor = executor
        self.read: Reader | None = None

    async def GetFeatures(
        self, request: pb.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetFeaturesResponse:
        check_id("card_id", request.card_id)
        check_id("merchant_id", request.merchant_id)
        check_id("terminal_id", request.terminal_id, required=False)
        read = self.read
        if read is None:
            raise Unavailable("feature store is still connecting")
        as_of = request.as_of.ToNanoseconds() / 1e9 if request.HasField("as_of") else time.time()
        if self._executor is None:
            # Inline: a sub-millisecond read costs less than a hop to a thread, which waits
            # for the GIL behind the gRPC poller (up to the 5 ms switch interval).
            rows = read(request.card_id, request.merchant_id, as_of, request.terminal_id)
        else:
            # In a thread, a store that hangs cannot stall the event loop and health checks.
            loop = asyncio.get_running_loop()
            rows = await loop.run_in_executor(
                self._executor,
                read,
                request.card_id,
                request.merchant_id,
                as_of,
                request.terminal_id,
            )
        response = pb.GetFeaturesResponse()
        add = response.features.add
        for name, (value, status, event_s) in zip(self._names, rows, strict=True):
            feature = add(name=name, value=value if value is not None else 0.0, status=status)
            if event_s is not None:
                # Set in place: no Timestamp built and copied per feature.
                stamp = feature.event_timestamp
                nanos = round(event_s * 1e9)
                stamp.seconds, stamp.nanos = divmod(nanos, 1_000_000_000)
        return response
