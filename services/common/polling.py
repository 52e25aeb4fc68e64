"""One loop for the gateway's run-time followers (the model lifecycle, the fraud team's
policy and lists): wait, check, and on failure keep what was read before and try again at
the next poll."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable


async def poll_forever(
    every_s: float,
    check: Callable[[], Awaitable[None]],
    log: logging.Logger,
    failure: str,
    *,
    log_once: bool = False,
) -> None:
    """Calls ``check`` every ``every_s`` seconds until cancelled. A failure is logged as
    ``failure`` with its stack: every time, or with ``log_once`` only the first of a run of
    failures (a store that stays down is not logged every poll)."""
    failing = False
    while True:
        await asyncio.sleep(every_s)
        try:
            await check()
        except Exception:
            if not (log_once and failing):
                log.exception(failure)
            failing = True
        else:
            failing = False
