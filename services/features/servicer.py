"""FeatureService servicer: request proto in, online-store read, feature vector proto out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.rpc import code_pb2

from fraud.v1 import features_pb2 as pb
from fraud.v1 import features_pb2_grpc as pb_grpc
from services.common.decoding import compile_checks
from services.common.errors import (
    DeadlineExceeded,
    FraudmeshError,
    InvalidArgument,
    Unavailable,
)
from services.common.streaming import answer_concurrently
from services.domain.featurespec import FeatureRead
from services.domain.validation import check_id

log = logging.getLogger(__name__)

Reader = Callable[[str, str, float, str], Sequence[FeatureRead]]
"""Reads (card_id, merchant_id, as_of_s, terminal_id) → one FeatureRead per store feature."""

ManyReader = Callable[[Sequence[tuple[str, str, float, str]]], list[list[FeatureRead]]]
"""Reads several such lookups at once (one round trip where the store allows)."""

_CHECK_STREAMED = compile_checks(pb.StreamFeaturesRequest.DESCRIPTOR)  # type: ignore[arg-type]
"""The range checks unary requests get in the runtime (``as_of`` within years 1..9999),
run here on each streamed request so that a failing one is answered on the stream."""


class FeatureServicer(pb_grpc.FeatureServiceServicer):
    """Reads one card's, merchant's and terminal's features; unknown entities come back MISSING."""

    def __init__(self, names: Sequence[str], executor: ThreadPoolExecutor | None) -> None:
        self._names = tuple(names)
        self._executor = executor
        self.read: Reader | None = None
        self.read_many: ManyReader | None = None

    async def GetFeatures(
        self, request: pb.GetFeaturesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetFeaturesResponse:
        read = self._reader(request)
        as_of = _as_of(request)
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
        self._fill(response, rows)
        return response

    async def StreamFeatures(
        self,
        request_iterator: AsyncIterator[pb.StreamFeaturesRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.StreamFeaturesResponse]:
        """Answers each request on the stream with its id. Inline reads answer in order;
        with a thread pool, requests are read concurrently and answered as they finish. A
        request that fails gets an error reply; the stream goes on."""
        # Headers first: the client knows the stream is open before it sends anything.
        await context.send_initial_metadata(())
        executor = self._executor
        if executor is None:
            async for request in request_iterator:
                yield self._stream_reply(request, time.monotonic())
            return
        loop = asyncio.get_running_loop()

        async def answer(
            request: pb.StreamFeaturesRequest, arrived: float
        ) -> pb.StreamFeaturesResponse:
            return await loop.run_in_executor(executor, self._stream_reply, request, arrived)

        async for reply in answer_concurrently(request_iterator, answer):
            yield reply

    def _stream_reply(
        self, request: pb.StreamFeaturesRequest, arrived: float
    ) -> pb.StreamFeaturesResponse:
        """The reply to one streamed request: every lookup's features, or why it failed."""
        reply = pb.StreamFeaturesResponse(id=request.id)
        try:
            if _CHECK_STREAMED is not None:
                _CHECK_STREAMED(request)
            if not request.lookups:
                raise InvalidArgument("lookups", "at least one lookup is required")
            lookups = []
            for index, lookup in enumerate(request.lookups):
                try:
                    read = self._reader(lookup)
                except InvalidArgument as error:
                    raise InvalidArgument(
                        f"lookups[{index}].{error.field}", error.description
                    ) from error
                lookups.append(
                    (lookup.card_id, lookup.merchant_id, _as_of(lookup), lookup.terminal_id)
                )
            if request.timeout_us and time.monotonic() - arrived > request.timeout_us / 1e6:
                raise DeadlineExceeded(f"request {request.id} waited past its timeout")
            read_many = self.read_many
            batches: Sequence[Sequence[FeatureRead]]
            if read_many is not None and len(lookups) > 1:
                batches = read_many(lookups)
            else:
                batches = [read(*lookup) for lookup in lookups]
            for rows in batches:
                self._fill(reply.results.add(), rows)
        except FraudmeshError as error:
            del reply.results[:]
            reply.error_code = getattr(code_pb2, error.code)
            reply.error_message = error.message
        except Exception:
            # A bug, not the caller's fault: logged whole, the caller told nothing internal.
            log.exception("unhandled error", extra={"method": "StreamFeatures"})
            del reply.results[:]
            reply.error_code = code_pb2.INTERNAL
            reply.error_message = "internal error"
        return reply

    def _reader(self, request: pb.GetFeaturesRequest) -> Reader:
        """The store reader, once the request's ids are checked."""
        check_id("card_id", request.card_id)
        check_id("merchant_id", request.merchant_id)
        check_id("terminal_id", request.terminal_id, required=False)
        read = self.read
        if read is None:
            raise Unavailable("feature store is still connecting")
        return read

    def _fill(self, response: pb.GetFeaturesResponse, rows: Sequence[FeatureRead]) -> None:
        add = response.features.add
        for name, (value, status, event_s) in zip(self._names, rows, strict=True):
            feature = add(name=name, value=value if value is not None else 0.0, status=status)
            if event_s is not None:
                # Set in place: no Timestamp built and copied per feature.
                stamp = feature.event_timestamp
                nanos = round(event_s * 1e9)
                stamp.seconds, stamp.nanos = divmod(nanos, 1_000_000_000)


def _as_of(request: pb.GetFeaturesRequest) -> float:
    """The point in time the features are judged against: ``as_of``, else now."""
    return request.as_of.ToNanoseconds() / 1e9 if request.HasField("as_of") else time.time()
