"""Persistent streams to the gateway's dependencies: many requests, few HTTP/2 streams.

In Python gRPC a unary call costs the client about 140 µs of CPU and the server about
170 µs; the same message on an open bidirectional stream costs about 50 µs and 35 µs. The
hop, not the work, is what a Score pays for, so the gateway keeps a few streams open per
dependency and multiplexes its requests over them (``StreamPool``):

* every request gets an id, and the lane's reader hands each reply to the request with
  that id, in whatever order replies come;
* every request carries its own deadline, the budget's slice for it. When it passes the
  caller gets a timeout (which its breaker counts); a reply that comes later is dropped
  and counted as late;
* a stream that breaks fails its pending requests at once, so the fallbacks answer on
  time, and is reopened with exponential backoff; while no stream is open, requests fail
  at once; a stream whose dependency stops answering altogether is reset;
* the streams are opened on one channel with round-robin balancing, so a name with
  several addresses (the replicas behind a headless Service) gets them spread over all;
* requests that queue up while a lane's previous write is in flight leave in the next
  write; with ``max_batch`` > 1 compatible ones are coalesced into one message (adaptive
  batching). By default nothing waits for more to arrive: batches only form when requests
  are already waiting. With ``max_queue_delay_s`` > 0 a lane holds its first request up to
  that long for others, but only while requests reach it more often than that (Triton's
  and MLServer's max queue delay, falling to zero at low load), and never for more than a
  tenth of the request's own deadline.

The wire format of each dependency is a ``StreamCodec``: ``FeatureCodec`` for
``fraud.v1.FeatureService/StreamFeatures``, ``ModelCodec`` for the Open Inference
Protocol's ``ModelStreamInfer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc

from fraud.v1 import features_pb2, features_pb2_grpc
from inference import grpc_predict_v2_pb2 as v2
from inference import grpc_predict_v2_pb2_grpc as v2_grpc
from services.common import telemetry
from services.gateway.metrics import GatewayMetrics
from services.gateway.ports import DependencyError, status_reason
from services.models.repository import ModelMetadata
from services.models.v2 import TRACEPARENTS, BadResponse, RowRequests, fraud_probabilities

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")
ItemIn = TypeVar("ItemIn", contravariant=True)
ResultOut = TypeVar("ResultOut", covariant=True)

_PRESENT = features_pb2.FEATURE_STATUS_PRESENT


class StreamCodec(Protocol[ItemIn, ResultOut]):
    """How one dependency's stream carries requests and replies."""

    dependency: str
    """The dependency's name in errors and metrics (``features``, ``scorer``)."""
    method: str
    """The stream's full method name (``/package.Service/Method``), for spans."""

    def open(self, channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
        """Opens a new stream on ``channel``."""
        ...

    def key(self, item: ItemIn) -> Hashable:
        """Items with equal keys may share one message."""
        ...

    def encode(
        self,
        request_id: int,
        items: Sequence[ItemIn],
        timeout_s: float,
        traceparents: Sequence[str] = (),
    ) -> Any:
        """The message asking for ``items``, to be answered within ``timeout_s``; with each
        traced item's ``traceparent`` (empty for the others) when any is traced."""
        ...

    def decode(self, reply: Any) -> tuple[int, Sequence[ResultOut] | DependencyError]:
        """The reply's request id and its ``count`` results, or the error it reports."""
        ...


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """How many streams, how large a message, how fast to reopen, when a stream is stuck."""

    streams: int = 2
    max_batch: int = 16
    max_queue_delay_s: float = 0.0
    """How long a lane may hold a request for others to join its message, while requests
    reach it at least this often; 0 never waits."""
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    stall_s: float = 1.0
    """A stream with requests pending and no reply for this long is reset."""
    open_timeout_s: float = 2.0
    """How long opening a stream may take before it counts as failed."""
    max_age_s: float = 8.0
    """A stream older than this (less up to 20 % jitter) is replaced: it takes no new
    requests, ends once its pending ones are answered, and is opened again, so streams
    spread over replicas added since; 0 keeps streams for ever."""


class _Waiter:
    """One caller waiting for its result."""

    __slots__ = ("deadline", "future", "lane", "queued_at", "request_id", "sent_at", "timer",
                 "traceparent")  # fmt: skip

    def __init__(self, future: asyncio.Future[Any], queued_at: float, deadline: float) -> None:
        self.future = future
        self.queued_at = queued_at
        self.deadline = deadline
        self.timer: asyncio.TimerHandle | None = None
        self.lane: _Lane[Any, Any] | None = None
        self.request_id = 0
        self.sent_at = 0.0
        self.traceparent = ""


class _Lane(Generic[Item, Result]):
    """One stream: a writer sending queued requests, a reader resolving their waiters."""

    def __init__(self, pool: StreamPool[Item, Result], index: int) -> None:
        self.pool = pool
        self.index = index
        self.call: grpc.aio.StreamStreamCall | None = None
        self.ready = False
        self.outbox: deque[tuple[Item, _Waiter]] = deque()
        self.pending: dict[int, list[_Waiter]] = {}
        self.wake = asyncio.Event()
        self.last_reply = 0.0
        self.draining = False
        self._aged: asyncio.TimerHandle | None = None
        """When this stream is to be replaced (``_drain``); cancelled when it ends."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"stream-{self.pool.name}-{self.index}")

    async def close(self) -> None:
        """Ends the lane: cancels its task until it ends (3.11's wait_for can lose a cancel)."""
        while self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)
        self._fail_all("closed")

    def reset(self, reason: str) -> None:
        """Ends the current stream (it is reopened); its pending requests fail at once."""
        call = self.call
        if call is not None and self.ready:
            log.warning(
                "resetting a stream", extra={"dependency": self.pool.name, "reason": reason}
            )
            self.pool.metrics.stream_resets.labels(self.pool.name, reason).inc()
            # Out of the rotation now, not when the reader notices: nothing new goes here.
            self.ready = False
            self.pool.lane_down(self)
            call.cancel()
            self._fail_all(reason)

    async def _run(self) -> None:
        """Opens the stream, serves it until it ends, reopens it after a backoff."""
        pool = self.pool
        failures = 0
        while True:
            served = await self._serve()
            failures = 0 if served else failures + 1
            delay = min(pool.settings.backoff_max_s, pool.settings.backoff_initial_s * 2**failures)
            # Jitter: replicas of the gateway must not reconnect in lockstep.
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _serve(self) -> bool:
        """One stream's life; True when it answered at least one request."""
        pool = self.pool
        call = pool.codec.open(pool.channel)
        self.call = call
        reason = "ended"
        answered = False
        writer: asyncio.Task[None] | None = None
        try:
            # The servers send their headers as soon as a stream opens: a stream is usable
            # once they arrive, and a dependency that is down fails here, not on a request.
            await asyncio.wait_for(call.initial_metadata(), pool.settings.open_timeout_s)
            if call.done():
                # A call that failed also "has" its (empty) headers: it never opened.
                reason = (await call.code()).name.lower()
                return False
            self.ready = True
            self.last_reply = time.monotonic()
            pool.lane_ready(self)
            writer = asyncio.create_task(self._write_loop(call))
            if pool.settings.max_age_s > 0:
                age = pool.settings.max_age_s * random.uniform(0.8, 1.0)
                self._aged = asyncio.get_running_loop().call_later(age, self._drain)
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    break
                answered = True
                self.last_reply = time.monotonic()
                self._resolve(reply)
        except grpc.aio.AioRpcError as error:
            reason = error.code().name.lower()
        except (TimeoutError, ConnectionError, grpc.aio.UsageError) as error:
            reason = type(error).__name__
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the pool is closing
            # The call was cancelled (a reset), not this task: reopen.
            reason = "reset"
        finally:
            if self._aged is not None:
                # A drain still due belongs to this stream, not to the next one.
                self._aged.cancel()
                self._aged = None
            was_ready = self.ready
            self.ready = False
            self.draining = False
            self.call = None
            pool.lane_down(self)
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            call.cancel()
            self._fail_all(reason)
            if was_ready:
                pool.metrics.stream_reconnects.labels(pool.name, reason).inc()
        return answered

    def _drain(self) -> None:
        """Retires an old stream gracefully: out of the rotation now, half-closed once the
        queued requests are sent; the dependency answers what it has and ends the stream,
        and the lane opens a new one. Waits while no other stream could take the traffic."""
        if not self.ready:
            return
        if self.pool.open_streams < 2:
            self._aged = asyncio.get_running_loop().call_later(1.0, self._drain)
            return
        self.draining = True
        self.ready = False
        self.pool.lane_down(self)
        self.pool.metrics.stream_reconnects.labels(self.pool.name, "max_age").inc()
        self.wake.set()

    async def _write_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            await self._write(call)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as error:
            # The stream broke under the write: end it, the reader fails what is pending.
            log.debug(
                "stream write failed", extra={"dependency": self.pool.name, "error": str(error)}
            )
            call.cancel()

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        pool = self.pool
        codec = pool.codec
        max_batch = pool.settings.max_batch
        max_delay = pool.settings.max_queue_delay_s if max_batch > 1 else 0.0
        outbox = self.outbox
        batch_rows = pool.metrics.stream_batch_rows.labels(pool.name)
        holds = pool.metrics.stream_holds.labels(pool.name)
        while True:
            if not outbox:
                if self.draining:
                    await call.done_writing()
                    return
                self.wake.clear()
                await self.wake.wait()
                continue
            if max_delay > 0 and len(outbox) < max_batch and pool.arrival_gap < max_delay:
                # Requests come faster than the delay: hold the oldest for company.
                oldest = outbox[0][1]
                hold = min(
                    max_delay - (time.monotonic() - oldest.queued_at),
                    (oldest.deadline - oldest.queued_at) / 10,
                )
                if hold > 0:
                    holds.inc()
                    await asyncio.sleep(hold)
                    if not outbox:
                        continue
            item, waiter = outbox.popleft()
            if waiter.future.done():
                continue
            items = [item]
            waiters = [waiter]
            if max_batch > 1 and outbox:
                self._gather(items, waiters, max_batch)
            request_id = pool.next_id()
            now = time.monotonic()
            for w in waiters:
                w.request_id = request_id
                w.sent_at = now
            timeout_s = min(w.deadline for w in waiters) - now
            self.pending[request_id] = waiters
            batch_rows.observe(len(items))
            traceparents = [w.traceparent for w in waiters]
            await call.write(
                codec.encode(
                    request_id,
                    items,
                    max(timeout_s, 0.0),
                    traceparents if any(traceparents) else (),
                )
            )

    def _gather(self, items: list[Item], waiters: list[_Waiter], max_batch: int) -> None:
        """Moves waiting requests of the first item's key into its batch; others keep order."""
        outbox, key_of = self.outbox, self.pool.codec.key
        key = key_of(items[0])
        kept: deque[tuple[Item, _Waiter]] = deque()
        while outbox and len(items) < max_batch:
            other, other_waiter = outbox.popleft()
            if other_waiter.future.done():
                continue
            if key_of(other) == key:
                items.append(other)
                waiters.append(other_waiter)
            else:
                kept.append((other, other_waiter))
        kept.extend(outbox)
        outbox.clear()
        outbox.extend(kept)

    def _resolve(self, reply: Any) -> None:
        pool = self.pool
        request_id, results = pool.codec.decode(reply)
        waiters = self.pending.pop(request_id, None)
        if waiters is None:
            pool.metrics.stream_late_replies.labels(pool.name).inc()
            return
        waiters_count = len(waiters)
        if not isinstance(results, DependencyError) and len(results) != waiters_count:
            results = DependencyError(
                pool.name, "bad_response", f"{len(results)} results for {waiters_count} requests"
            )
        late = True
        for index, waiter in enumerate(waiters):
            if waiter.future.done():
                continue
            late = False
            if waiter.timer is not None:
                waiter.timer.cancel()
            if isinstance(results, DependencyError):
                waiter.future.set_exception(results)
            else:
                waiter.future.set_result(results[index])
        if late:
            pool.metrics.stream_late_replies.labels(pool.name).inc()

    def expired(self) -> None:
        """A deadline passed on this lane: drop requests nobody waits for once they are old,
        and reset the stream when its oldest request has had no reply at all (the
        dependency stopped reading or answering) for ``stall_s``."""
        now = time.monotonic()
        stall_s = self.pool.settings.stall_s
        pending = self.pending
        while pending:
            request_id, waiters = next(iter(pending.items()))
            sent_at = waiters[0].sent_at
            if now - sent_at <= stall_s:
                return
            if self.last_reply < sent_at:
                self.reset("stalled")
                return
            if not all(w.future.done() for w in waiters):
                return
            # Others were answered since: this reply was lost or is very late.
            del pending[request_id]

    def _fail_all(self, reason: str) -> None:
        error = DependencyError(self.pool.name, "unavailable", f"stream {reason}")
        waiters = [w for ws in self.pending.values() for w in ws]
        waiters.extend(w for _, w in self.outbox)
        self.pending.clear()
        self.outbox.clear()
        for waiter in waiters:
            if not waiter.future.done():
                if waiter.timer is not None:
                    waiter.timer.cancel()
                waiter.future.set_exception(error)


class StreamPool(Generic[Item, Result]):
    """A few persistent streams to one dependency, requests spread over them round-robin."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        codec: StreamCodec[Item, Result],
        metrics: GatewayMetrics,
        settings: StreamSettings | None = None,
    ) -> None:
        self.channel = channel
        self.codec = codec
        self.name = codec.dependency
        self.metrics = metrics
        self.settings = settings or StreamSettings()
        self._lanes = [_Lane(self, i) for i in range(max(1, self.settings.streams))]
        self._ready: list[_Lane[Item, Result]] = []
        self._turn = 0
        self._ids = itertools.count(1)
        self._max_batch = self.settings.max_batch
        self._gathering = self.settings.max_queue_delay_s > 0 and self._max_batch > 1
        """Messages may be held for company (a max queue delay is set)."""
        self.arrival_gap = float("inf")
        """Moving average of the time between requests (kept while gathering)."""
        self._last_arrival = 0.0
        self._opened = asyncio.Event()
        self._started = False

    def start(self) -> None:
        """Opens the streams in the background (each reopens itself when it breaks)."""
        if not self._started:
            self._started = True
            for lane in self._lanes:
                lane.start()

    async def wait_open(self, timeout_s: float) -> bool:
        """Waits until at least one stream is open; False when none opened in time."""
        try:
            await asyncio.wait_for(self._opened.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @property
    def open_streams(self) -> int:
        """Streams open now."""
        return len(self._ready)

    def next_id(self) -> int:
        return next(self._ids)

    def lane_ready(self, lane: _Lane[Item, Result]) -> None:
        if lane not in self._ready:
            self._ready.append(lane)
        self._opened.set()
        self.metrics.stream_open.labels(self.name).set(len(self._ready))

    def lane_down(self, lane: _Lane[Item, Result]) -> None:
        if lane in self._ready:
            self._ready.remove(lane)
        if not self._ready:
            self._opened.clear()
        self.metrics.stream_open.labels(self.name).set(len(self._ready))

    async def request(self, item: Item, timeout_s: float) -> Result:
        """``item``'s result; DependencyError when no stream is open, the stream breaks,
        the dependency reports an error, or ``timeout_s`` passes first. A traced request
        gets a CLIENT span, whose context travels in the message."""
        if not telemetry.sampled():
            return await self._request(item, timeout_s, "")
        with telemetry.start_stream_client_span(self.codec.method) as span:
            try:
                return await self._request(item, timeout_s, telemetry.traceparent())
            except DependencyError as error:
                telemetry.mark_error(span, error.reason)
                raise

    async def _request(self, item: Item, timeout_s: float, traceparent: str) -> Result:
        ready = self._ready
        if not ready:
            raise DependencyError(self.name, "unavailable", "no open stream")
        lane = ready[self._turn % len(ready)]
        if not (self._gathering and lane.outbox and len(lane.outbox) < self._max_batch):
            # Round-robin; while messages are held for company, the next request joins the
            # one forming rather than starting another on the next stream.
            self._turn += 1
            lane = ready[self._turn % len(ready)]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        now = time.monotonic()
        waiter = _Waiter(future, now, now + timeout_s)
        waiter.lane = lane
        waiter.traceparent = traceparent
        if self._gathering:
            if self._last_arrival:
                # A pause counts as a second at most, so traffic that resumes soon shows.
                gap = min(now - self._last_arrival, 1.0)
                previous = self.arrival_gap
                self.arrival_gap = (
                    gap if previous == float("inf") else previous + 0.2 * (gap - previous)
                )
            self._last_arrival = now
        waiter.timer = loop.call_later(timeout_s, self._expire, waiter)
        lane.outbox.append((item, waiter))
        lane.wake.set()
        try:
            return await future
        finally:
            if not future.done():
                # The caller went away: nobody waits for the reply any more.
                waiter.timer.cancel()
                future.cancel()

    def _expire(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        waiter.future.set_exception(
            DependencyError(self.name, "timeout", "no reply within the request's deadline")
        )
        if waiter.lane is not None:
            waiter.lane.expired()

    async def close(self) -> None:
        """Closes every stream; requests still waiting fail."""
        for lane in self._lanes:
            await lane.close()


# --- the two dependencies' wire formats ---------------------------------------------------

FeatureLookup = tuple[str, str, float, str]
"""(card_id, merchant_id, as_of_s, terminal_id)."""

FeatureValues = Mapping[str, float | None]


def feature_values(response: features_pb2.GetFeaturesResponse) -> FeatureValues:
    """Store features by name; None for missing or stale ones."""
    return {f.name: (f.value if f.status == _PRESENT else None) for f in response.features}


class FeatureCodec:
    """``fraud.v1.FeatureService/StreamFeatures``: lookups in, feature values out."""

    dependency = "features"
    method = "/fraud.v1.FeatureService/StreamFeatures"

    def open(self, channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
        return features_pb2_grpc.FeatureServiceStub(channel).StreamFeatures()

    def key(self, item: FeatureLookup) -> Hashable:
        return None  # any lookups may share a message

    def encode(
        self,
        request_id: int,
        items: Sequence[FeatureLookup],
        timeout_s: float,
        traceparents: Sequence[str] = (),
    ) -> features_pb2.StreamFeaturesRequest:
        request = features_pb2.StreamFeaturesRequest(
            id=request_id, timeout_us=max(1, round(timeout_s * 1e6)), traceparents=traceparents
        )
        add = request.lookups.add
        for card_id, merchant_id, as_of_s, terminal_id in items:
            lookup = add(card_id=card_id, merchant_id=merchant_id, terminal_id=terminal_id)
            lookup.as_of.seconds, lookup.as_of.nanos = divmod(round(as_of_s * 1e9), 1_000_000_000)
        return request

    def decode(
        self, reply: features_pb2.StreamFeaturesResponse
    ) -> tuple[int, Sequence[FeatureValues] | DependencyError]:
        if reply.error_code:
            reason = status_reason(reply.error_code)
            return reply.id, DependencyError(self.dependency, reason, reply.error_message)
        return reply.id, [feature_values(result) for result in reply.results]


class StreamFeatureClient:
    """The pipeline's FeatureClient over a StreamPool of StreamFeatures streams."""

    def __init__(self, pool: StreamPool[FeatureLookup, FeatureValues]) -> None:
        self.pool = pool

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> FeatureValues:
        """Store features by name; None for missing or stale ones."""
        return await self.pool.request((card_id, merchant_id, as_of_s, terminal_id), timeout_s)


ModelRow = tuple[RowRequests, list[float]]
"""A version's request builder and one feature vector."""


class ModelCodec:
    """The Open Inference Protocol's ``ModelStreamInfer``: rows in, fraud probabilities out.
    Rows of one version may share a request ([k, n] input); the request's ``timeout``
    parameter (µs) is its deadline, as Triton defines it."""

    dependency = "scorer"
    method = "/inference.GRPCInferenceService/ModelStreamInfer"

    def open(self, channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
        return v2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()

    def key(self, item: ModelRow) -> Hashable:
        return id(item[0])

    def encode(
        self,
        request_id: int,
        items: Sequence[ModelRow],
        timeout_s: float,
        traceparents: Sequence[str] = (),
    ) -> v2.ModelInferRequest:
        requests = items[0][0]
        if len(items) == 1:
            request = requests.request(items[0][1])
        else:
            request = requests.batch([vector for _, vector in items])
        request.id = str(request_id)
        request.parameters["timeout"].int64_param = max(1, round(timeout_s * 1e6))
        if traceparents:
            # One per row, in order (a traceparent holds no comma).
            request.parameters[TRACEPARENTS].string_param = ",".join(traceparents)
        return request

    def decode(
        self, reply: v2.ModelStreamInferResponse
    ) -> tuple[int, Sequence[float] | DependencyError]:
        response = reply.infer_response
        try:
            request_id = int(response.id)
        except ValueError:
            request_id = -1
        if reply.error_message:
            # The scorer's stream errors read "STATUS_NAME: message", as Triton's.
            name, _, _ = reply.error_message.partition(":")
            reason = status_reason(name.strip())
            return request_id, DependencyError(self.dependency, reason, reply.error_message)
        rows = response.outputs[0].shape[0] if response.outputs else 0
        try:
            return request_id, fraud_probabilities(response, rows)
        except BadResponse as error:
            return request_id, DependencyError(self.dependency, "bad_response", str(error))


class StreamModelClient:
    """The pipeline's ModelClient for one version, over the scorer's StreamPool."""

    def __init__(self, pool: StreamPool[ModelRow, float], metadata: ModelMetadata) -> None:
        self.pool = pool
        self._requests = RowRequests.for_model(metadata)

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability of one row."""
        return await self.pool.request((self._requests, vector), timeout_s)

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        """Fraud probabilities of several rows (each its own request; the pool coalesces
        them when batching is on)."""
        return list(await asyncio.gather(*(self.score(v, timeout_s) for v in vectors)))


def stream_pools(
    features_channel: grpc.aio.Channel,
    scorer_channel: grpc.aio.Channel,
    metrics: GatewayMetrics,
    settings: StreamSettings,
) -> tuple[StreamPool[FeatureLookup, FeatureValues], StreamPool[ModelRow, float]]:
    """The gateway's two pools, started."""
    features: StreamPool[FeatureLookup, FeatureValues] = StreamPool(
        features_channel, FeatureCodec(), metrics, settings
    )
    scorer: StreamPool[ModelRow, float] = StreamPool(
        scorer_channel, ModelCodec(), metrics, settings
    )
    features.start()
    scorer.start()
    return features, scorer


__all__ = [
    "FeatureCodec",
    "ModelCodec",
    "StreamCodec",
    "StreamFeatureClient",
    "StreamModelClient",
    "StreamPool",
    "StreamSettings",
    "stream_pools",
]
