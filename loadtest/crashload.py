"""The crash matrix's client, in a process of its own: Score calls at a fixed rate through the
edge over several connections of the project's Python client, each call's outcome reported
on its standard output as it ends.

The payment system is not the process that kills and restarts the mesh's children: the
matrix's own work (the supervisor's readiness probes, reading the decision log) would
otherwise hold this client's event loop now and then, and the calls owed meanwhile would
leave together and be late for the client alone. The module imports only what the calls
need, so that the process starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest.drive import VERSION_ANSWERS
from services import client

Request = tuple[str, str, int, str, bool]
"""(card_id, merchant_id, amount_minor, currency, card_not_present)."""


def _request(item: Request, transaction_id: str) -> pb.ScoreRequest:
    card, merchant, amount, currency, card_not_present = item
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    return pb.ScoreRequest(
        transaction_id=transaction_id,
        card_id=card,
        merchant_id=merchant,
        amount_minor=amount,
        currency=currency,
        timestamp=ts,
        channel=pb.CHANNEL_CARD_NOT_PRESENT if card_not_present else pb.CHANNEL_CARD_PRESENT,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.crashload --target HOST:PORT --requests FILE …``: sends until its
    standard input ends or says ``stop``; prints ``ready`` once every connection is up, then
    ``call <sent_s> <latency_s> <status> <transaction_id> <degraded 0|1>`` per call
    (monotonic seconds, comparable across processes on the machine), ``error <text>`` on a
    failure, and ``end`` last."""
    parser = argparse.ArgumentParser(prog="python -m loadtest.crashload")
    parser.add_argument("--target", required=True)
    parser.add_argument("--requests", type=Path, required=True, help="JSON list of requests")
    parser.add_argument("--rps", type=float, required=True)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--deadline-s", type=float, default=0.042)
    parser.add_argument("--prefix", default="crash")
    args = parser.parse_args(argv)
    requests = [tuple(r) for r in json.loads(args.requests.read_text())]
    stop = threading.Event()

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch, name="crashload-stdin", daemon=True).start()
    # Nothing the process holds now needs collecting: a full collection mid-run would hold
    # the sending loop, and the calls owed meanwhile would leave together.
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(
            _drive(
                args.target,
                requests,
                args.rps,
                args.connections,
                args.deadline_s,
                args.prefix,
                _say,
                stop,
            )
        )
    except Exception as error:
        _say("error", repr(error).replace("\n", " "))
    finally:
        _say("end")


def _say(*fields: object) -> None:
    sys.stdout.write(" ".join(str(f) for f in fields) + "\n")
    sys.stdout.flush()


async def _drive(
    target: str,
    requests: Sequence[Request],
    rps: float,
    connections: int,
    deadline_s: float,
    prefix: str,
    say: Callable[..., None],
    stop: threading.Event,
) -> None:
    # A channel of its own per connection: channels to one target would otherwise share
    # one connection, which a single Envoy would hold.
    local = ("grpc.use_local_subchannel_pool", 1)
    channels = [client.PLAINTEXT.aio_channel(target, local) for _ in range(connections)]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in channels)), 30)
        stubs = [pb_grpc.FraudScoringStub(c) for c in channels]
        say("ready")
        tasks: set[asyncio.Task[None]] = set()
        interval, start, i = 1.0 / rps, time.monotonic(), 0
        while not stop.is_set():
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            request = _request(requests[i % len(requests)], f"{prefix}-{i}")
            task = asyncio.create_task(_call(stubs[i % len(stubs)], request, deadline_s, say))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.wait(tasks)
    finally:
        for channel in channels:
            await channel.close()


async def _call(
    stub: pb_grpc.FraudScoringStub,
    request: pb.ScoreRequest,
    deadline_s: float,
    say: Callable[..., None],
) -> None:
    sent = time.monotonic()
    try:
        response = await stub.Score(request, timeout=deadline_s)
    except grpc.aio.AioRpcError as error:
        latency = time.monotonic() - sent
        say("call", sent, latency, error.code().name, request.transaction_id, 0)
        return
    latency = time.monotonic() - sent
    # The cascade's first-stage approvals are full-quality answers of the version.
    degraded = (
        response.scored_by not in VERSION_ANSWERS
        or response.feature_source == pb.FEATURE_SOURCE_DEFAULT
    )
    say("call", sent, latency, "OK", request.transaction_id, int(degraded))


if __name__ == "__main__":
    main()
