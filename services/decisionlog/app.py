"""The decision sink as a mesh process: health, metrics and ordered shutdown around the loop.

The loop (``sink.DecisionSink``) runs in a thread of its own, since the event log's calls
block. The process serves only ``grpc.health.v1.Health``: NOT_SERVING until the sink has
connected to the log and caught up with it, then SERVING; NOT_SERVING again on SIGTERM,
while the sink reads what is left, writes it and commits.

``serve`` is the shared runtime's ``serve`` with two additions a consumer needs: a SIGTERM
that comes while the sink is still catching up (or waiting for a backend that is down)
stops it at once instead of after the catch-up, and a loop that dies (a corrupt log, a
bug) stops the process with a non-zero status so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading

import grpc
from prometheus_client import start_http_server

from services.common import logs, telemetry
from services.common.server import Runtime, trace_plan
from services.decisionlog.metrics import SinkMetrics
from services.decisionlog.settings import DecisionLogSettings
from services.decisionlog.sink import DecisionSink
from services.decisionlog.writer import RootBusyError
from services.eventlog import EventLogSettings

log = logging.getLogger(__name__)

_READY_CHECK_S = 0.05


class StartInterrupted(Exception):
    """SIGTERM came before the sink had caught up."""


class SinkStopped(RuntimeError):
    """The sink's loop ended on its own (an error it does not retry)."""


class DecisionLogApp:
    """Runs the decision sink's loop in a thread; ready once it has caught up."""

    name = "decisionlog"

    def __init__(
        self,
        settings: DecisionLogSettings,
        log_settings: EventLogSettings,
        metrics: SinkMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.sink = DecisionSink(settings, log_settings, metrics)
        self.failure: BaseException | None = None
        self.finished = asyncio.Event()
        """Set when the loop's thread has ended."""
        self._interrupted = asyncio.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, server: grpc.aio.Server) -> list[str]:
        """The sink serves no API of its own: only health (added by the runtime)."""
        return []

    def interrupt(self) -> None:
        """A stop was requested: ``start`` gives up waiting for the catch-up."""
        self._interrupted.set()

    async def start(self) -> None:
        """Recovers, starts the loop, and returns once it has connected and caught up."""
        try:
            skipped = await asyncio.to_thread(self.sink.recover)
        except RootBusyError as exc:
            self.failure = exc
            raise SinkStopped(str(exc)) from exc
        loop = asyncio.get_running_loop()

        def run() -> None:
            try:
                self.sink.run(self._stop)
            except BaseException as exc:
                self.failure = exc
                log.exception("decision sink loop failed")
            finally:
                loop.call_soon_threadsafe(self.finished.set)

        self._thread = threading.Thread(target=run, name="decision-sink", daemon=True)
        self._thread.start()
        log.info(
            "decision sink catching up",
            extra={"root": str(self.settings.root_path), "skip_ids": skipped},
        )
        while not self.sink.caught_up.is_set():
            if self.finished.is_set():
                raise SinkStopped("the decision sink stopped while catching up") from self.failure
            if self._interrupted.is_set():
                raise StartInterrupted
            await asyncio.sleep(_READY_CHECK_S)

    async def close(self) -> None:
        """Stops the loop: it reads what is left, writes it and commits, then returns."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)


async def _run(settings: DecisionLogSettings, app: DecisionLogApp) -> int:
    runtime = Runtime(settings, app)

    def request_stop() -> None:
        app.interrupt()
        runtime.stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop)
    failed = False
    try:
        await runtime.start()
    except StartInterrupted:
        log.info("stopping before the sink caught up")
    except SinkStopped as exc:
        log.error("decision sink cannot run: %s", exc)
        failed = True
    else:
        stopping = asyncio.ensure_future(runtime.stopping.wait())
        finished = asyncio.ensure_future(app.finished.wait())
        await asyncio.wait({stopping, finished}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        finished.cancel()
    await runtime.stop()
    return 1 if failed or app.failure is not None else 0


def serve(settings: DecisionLogSettings, log_settings: EventLogSettings) -> None:
    """Runs the sink until SIGTERM or SIGINT; exits non-zero if its loop failed."""
    logs.configure(DecisionLogApp.name, settings.log_level, settings.log_json)
    telemetry.configure(trace_plan(DecisionLogApp.name, settings))
    if settings.metrics_port is not None:
        start_http_server(settings.metrics_port, addr=settings.host)
    status = asyncio.run(_run(settings, DecisionLogApp(settings, log_settings)))
    sys.exit(status)
