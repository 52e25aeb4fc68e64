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
from services.common import telemetry
from services.common.decoding import compile_checks
from services.common.errors import (
    DeadlineExceeded,
    FraudmeshError,
    InvalidArgument,
    Unavailable,
)
from services.common.rpc_observer import observe_message
from services.common.streaming import answer_concurrently, held_open
from services.domain.featurespec import FeatureRead
from services.domain.validation import check_id
from services.features.metrics import FeatureMetrics, feature_metrics

log = logging.getLogger(__name__)

Reader = Callable[[str, str, float, str], Sequence[FeatureRead]]
"""Reads (card_id, merchant_id, as_of_s, terminal_id) → one FeatureRead per store feature."""

ManyReader = Callable[[Sequence[tuple[str, str, float, str]]], list[list[FeatureRead]]]
"""Reads several such lookups at once (one round trip where the store allows)."""

_CHECK_STREAMED = compile_checks(pb.StreamFeaturesRequest.DESCRIPTOR)  # type: ignore[arg-type]
"""The range checks unary requests get in the runtime (``as_of`` within years 1..9999),
run here on each streamed request so that a failing one is answered on the stream."""


_STREAM_METHOD = "/fraud.v1.FeatureService/StreamFeatures"


class FeatureServicer(pb_grpc.FeatureServiceServicer):
    """Reads one card's, merchant's and terminal's features; unknown entities come back MISSING."""

    def __init__(
        self,
        names: Sequence[str],
        executor: ThreadPoolExecutor | None,
        metrics: FeatureMetrics | None = None,
        observe: bool = True,
    ) -> None:
        self._names = tuple(names)
        self._executor = executor
        self.read: Reader | None = None
        self.read_many: ManyReader | None = None
        self.metrics = metrics or feature_metrics()
        self._observe = observe
        self._observe_message = observe_message(_STREAM_METHOD)

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
        self._fill(response, rows, as_of)
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
        with held_open():
            if executor is None:
                async for request in request_iterator:
                    arrived = time.monotonic()
                    reply = self._stream_reply(request, arrived)
                    self._answered(reply, arrived)
                    yield reply
                return
            loop = asyncio.get_running_loop()

            async def answer(
                request: pb.StreamFeaturesRequest, arrived: float
            ) -> pb.StreamFeaturesResponse:
                return await loop.run_in_executor(executor, self._stream_reply, request, arrived)

            async for reply in answer_concurrently(request_iterator, answer, self._answered):
                yield reply

    def _answered(self, reply: pb.StreamFeaturesResponse, arrived: float) -> None:
        """Observes one streamed request's latency, with its reply's status."""
        if self._observe:
            self._observe_message(time.monotonic() - arrived, reply.error_code)

    def _stream_reply(
        self, request: pb.StreamFeaturesRequest, arrived: float
    ) -> pb.StreamFeaturesResponse:
        """The reply to one streamed request, and a span for each traced lookup's caller."""
        reply = self._reply(request, arrived)
        if request.traceparents and telemetry.enabled():
            for parent in request.traceparents:
                telemetry.record_stream_server_span(
                    _STREAM_METHOD, parent, arrived, reply.error_code
                )
        return reply

    def _reply(
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
            for rows, (_, _, as_of, _) in zip(batches, lookups, strict=True):
                self._fill(reply.results.add(), rows, as_of)
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

    def _fill(
        self, response: pb.GetFeaturesResponse, rows: Sequence[FeatureRead], as_of: float
    ) -> None:
        """Fills one lookup's answer and observes the age of the oldest row it used."""
        add = response.features.add
        oldest: float | None = None
        for name, (value, status, event_s) in zip(self._names, rows, strict=True):
            feature = add(name=name, value=value if value is not None else 0.0, status=status)
            if event_s is not None:
                if oldest is None or event_s < oldest:
                    oldest = event_s
                # Set in place: no Timestamp built and copied per feature.
                stamp = feature.event_timestamp
                nanos = round(event_s * 1e9)
                stamp.seconds, stamp.nanos = divmod(nanos, 1_000_000_000)
        if not self._observe:
            return
        if oldest is None:
            self.metrics.empty.inc()
        else:
            self.metrics.row_age.observe(max(as_of - oldest, 0.0))


def _as_of(request: pb.GetFeaturesRequest) -> float:
    """The point in time the features are judged against: ``as_of``, else now."""
    return request.as_of.ToNanoseconds() / 1e9 if request.HasField("as_of") else time.time()
