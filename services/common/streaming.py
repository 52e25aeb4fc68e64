"""Serving a bidirectional stream whose replies may finish out of order.

Stream handlers are async generators (what gRPC's interceptors, OpenTelemetry's among
them, expect of a streamed response). ``answer_concurrently`` reads requests as they come,
works on each in its own task and yields each reply as soon as it is ready, so one slow
request does not hold up the others on the stream; it ends once the client has stopped
sending and every reply is out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

_END = object()


async def answer_concurrently(
    requests: AsyncIterator[Request],
    answer: Callable[[Request, float], Coroutine[Any, Any, Reply]],
    answered: Callable[[Reply, float], None] | None = None,
) -> AsyncIterator[Reply]:
    """Yields ``answer(request, arrived)`` for every request, in the order they finish;
    ``arrived`` is the request's arrival on the monotonic clock. ``answered(reply, arrived)``
    runs as each reply is handed to the stream (for its latency)."""
    ready: asyncio.Queue[object] = asyncio.Queue()
    working: set[asyncio.Task[Reply]] = set()
    arrivals: dict[asyncio.Task[Reply], float] = {}

    def finished(task: asyncio.Task[Reply]) -> None:
        working.discard(task)
        ready.put_nowait(task)

    async def read() -> None:
        try:
            async for request in requests:
                arrived = time.monotonic()
                task: asyncio.Task[Reply] = asyncio.create_task(answer(request, arrived))
                if answered is not None:
                    arrivals[task] = arrived
                working.add(task)
                task.add_done_callback(finished)
        finally:
            ready.put_nowait(_END)

    reader = asyncio.create_task(read())
    reading = True
    try:
        while reading or working or not ready.empty():
            item = await ready.get()
            if item is _END:
                reading = False
                if reader.done() and not reader.cancelled() and reader.exception() is not None:
                    raise reader.exception()  # type: ignore[misc]
                continue
            task = item
            assert isinstance(task, asyncio.Task)
            if not task.cancelled():
                reply = task.result()
                if answered is not None:
                    answered(reply, arrivals.pop(task))
                yield reply
    finally:
        reader.cancel()
        for task in working:
            task.cancel()
