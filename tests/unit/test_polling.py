"""The followers' poll loop: keeps polling through failures, logs each or only the first."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.common.polling import poll_forever


async def _run(outcomes: list[bool], log_once: bool, caplog: pytest.LogCaptureFixture) -> int:
    calls = 0
    done = asyncio.Event()

    async def check() -> None:
        nonlocal calls
        calls += 1
        if calls == len(outcomes):
            done.set()
        if calls <= len(outcomes) and not outcomes[calls - 1]:
            raise OSError("store down")

    log = logging.getLogger("test.polling")
    with caplog.at_level(logging.ERROR, logger="test.polling"):
        task = asyncio.create_task(
            poll_forever(0.0, check, log, "cannot follow", log_once=log_once)
        )
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
    return sum(r.getMessage() == "cannot follow" for r in caplog.records)


async def test_every_failure_is_logged_and_polling_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await _run([False, False, True, False], log_once=False, caplog=caplog) == 3


async def test_log_once_logs_the_first_of_each_run_of_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await _run([False, False, True, False, False], log_once=True, caplog=caplog) == 2
