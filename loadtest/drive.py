"""A bounded open-loop load generator in Python that keeps every answer.

ghz measures latency well but keeps no response bodies. Checks that depend on what each
answer says (which model version produced it, for which card, whether the rules answered)
use this instead: calls go out on a fixed schedule (open loop: a slow answer does not delay
the next call), each with the client's deadline, and every call is recorded with its send
time, latency, status and the fields of its answer. At most ``max_in_flight`` calls are
outstanding; a tick that finds the limit reached is recorded as not sent rather than
queued, so the generator can never build a backlog.

It runs its own event loop in a thread, so a test can drive load while it changes the
mesh from the main thread.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest.data import Txn

VERSION_ANSWERS = (pb.SCORED_BY_MODEL, pb.SCORED_BY_FIRST_STAGE)
"""Answers that are the version's own at full quality: its model's, or its cascade's first
stage (not the small model standing in, nor the rules)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call and its answer."""

    sent_s: float
    """Monotonic send time."""
    latency_s: float
    status: str
    """gRPC status name (OK, DEADLINE_EXCEEDED, …; NOT_SENT when the in-flight limit hit)."""
    card_id: str
    model_version: str = ""
    scored_by: int = 0
    decision: int = 0
    reasons: tuple[str, ...] = ()


@dataclass
class Calls:
    """Recorded calls, with helpers to slice and count them."""

    calls: list[Call] = field(default_factory=list)

    def between(self, start_s: float, end_s: float) -> Calls:
        """Calls sent in [start_s, end_s)."""
        return Calls([c for c in self.calls if start_s <= c.sent_s < end_s])

    def statuses(self) -> Counter[str]:
        """Calls by status."""
        return Counter(c.status for c in self.calls)

    def versions(self) -> Counter[str]:
        """OK answers by the version that produced them (``rules-…`` for the rules)."""
        return Counter(c.model_version for c in self.calls if c.status == "OK")

    def model_versions(self) -> Counter[str]:
        """Answers given by a version at full quality (its model or its cascade's first
        stage), by model version."""
        return Counter(
            c.model_version
            for c in self.calls
            if c.status == "OK" and c.scored_by in VERSION_ANSWERS
        )

    def ok(self) -> list[Call]:
        """The calls answered OK."""
        return [c for c in self.calls if c.status == "OK"]

    def __len__(self) -> int:
        return len(self.calls)


def score_request(txn: Txn, transaction_id: str) -> pb.ScoreRequest:
    """A ScoreRequest for ``txn``, stamped now."""
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return pb.ScoreRequest(
        transaction_id=transaction_id,
        card_id=txn.card_id,
        merchant_id=txn.merchant_id,
        amount_minor=txn.amount_minor,
        currency=txn.currency,
        timestamp=ts,
        channel=pb.CHANNEL_CARD_NOT_PRESENT if txn.card_not_present else pb.CHANNEL_CARD_PRESENT,
    )


class Driver:
    """Sends Score calls to ``target`` at ``rps`` from a background thread until stopped."""

    def __init__(
        self,
        target: str,
        population: Sequence[Txn],
        rps: float,
        deadline_s: float = 0.042,
        max_in_flight: int = 200,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not population:
            raise ValueError("no transactions to send")
        self.target = target
        self.population = population
        self.rps = rps
        self.deadline_s = deadline_s
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.calls = Calls()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Starts sending.

        The objects the process holds by now (a test's or a benchmark's: pandas, Feast, a
        dataset, a few hundred thousand of them) are moved out of the garbage collector's
        reach first: a full collection of them holds the interpreter for a tenth of a
        second or more (half a second measured on a busy 2-core machine), and the calls
        owed meanwhile would then leave together and be late for the client alone."""
        gc.collect()
        gc.freeze()
        self._thread = threading.Thread(target=self._run, name="load-driver", daemon=True)
        self._thread.start()

    def stop(self) -> Calls:
        """Stops sending, waits for the calls in flight, returns every call."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._error is not None:
            raise RuntimeError("load driver failed") from self._error
        return self.calls

    def _run(self) -> None:
        try:
            asyncio.run(self._drive())
        except BaseException as error:  # reported by stop()
            self._error = error

    async def _drive(self) -> None:
        async with grpc.aio.insecure_channel(self.target) as channel:
            await channel.channel_ready()
            stub = pb_grpc.FraudScoringStub(channel)
            in_flight: set[asyncio.Task[None]] = set()
            interval = 1.0 / self.rps
            start = self.clock()
            i = 0
            while not self._stop.is_set():
                due = start + i * interval
                delay = due - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                txn = self.population[i % len(self.population)]
                i += 1
                if len(in_flight) >= self.max_in_flight:
                    self.calls.calls.append(Call(self.clock(), 0.0, "NOT_SENT", txn.card_id))
                    continue
                task = asyncio.create_task(self._call(stub, txn, f"drive-{i}-{time.time_ns()}"))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            if in_flight:
                await asyncio.wait(in_flight)

    async def _call(self, stub: pb_grpc.FraudScoringStub, txn: Txn, transaction_id: str) -> None:
        request = score_request(txn, transaction_id)
        sent = self.clock()
        try:
            response = await stub.Score(request, timeout=self.deadline_s)
        except grpc.aio.AioRpcError as error:
            self.calls.calls.append(Call(sent, self.clock() - sent, error.code().name, txn.card_id))
            return
        self.calls.calls.append(
            Call(
                sent,
                self.clock() - sent,
                "OK",
                txn.card_id,
                response.model_version,
                response.scored_by,
                response.decision,
                tuple(response.reasons),
            )
        )
