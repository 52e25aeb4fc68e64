"""Serving a bidirectional stream whose replies may finish out of order.

Stream handlers are async generators (what gRPC's interceptors, OpenTelemetry's among
them, expect of a streamed response). ``answer_concurrently`` reads requests as they come,
works on each in its own task and yields each reply as soon as it is ready, so one slow
request does not hold up the others on the stream; it ends once the client has stopped
sending and every reply is out.

A stream the gateway keeps open lasts as long as its connection: a stopping server would
wait its whole grace period for it (5 s by default) after the drain. Handlers run inside
``held_open``; the server's shutdown ends them with ``end_open_streams`` once its drain is
over and it refuses new calls (the client reads the end of the stream, with OK), so the
process exits as soon as its unary calls are done. What a client had sent on such a stream
and not yet got back goes unanswered there, as it would at the end of the grace period (the
gateway answers it by its fallbacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

_END = object()

_OPEN: set[asyncio.Task[Any]] = set()
"""The tasks of the stream handlers running now (``held_open``)."""
_ENDING: set[asyncio.Task[Any]] = set()
"""Those ``end_open_streams`` has cancelled: their cancellation ends the stream, as a reply."""


@contextlib.contextmanager
def held_open() -> Iterator[None]:
    """Marks the running task as a stream handler that lasts until the client ends it. When
    ``end_open_streams`` cancels it, the block ends and the handler returns: the stream ends
    with OK, and the server need not wait for it. (A cancelled handler that let the
    cancellation through would leave the call open at gRPC's core until the grace period
    ended.)"""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    _OPEN.add(task)
    try:
        yield
    except asyncio.CancelledError:
        if task not in _ENDING:
            raise  # the client went away, or the server is past its grace period
        task.uncancel()
    finally:
        _OPEN.discard(task)
        _ENDING.discard(task)


def end_open_streams() -> int:
    """Ends every stream handler marked by ``held_open`` and not ended yet; returns how many.
    Requests the client sent that the handler had not answered are not answered."""
    tasks = [task for task in _OPEN if task not in _ENDING]
    for task in tasks:
        _ENDING.add(task)
        task.cancel()
    return len(tasks)


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
