"""The monitor as a Service for the shared runtime.

Start: open the state file (the last checkpoint's slices and cohorts come back), read the
advice already given, and run the consume loop (``loop.py``) on its own thread, and the
rollout controller (``controller.py``) on another, which acts only while the loop is caught
up. The server
only answers health checks (and reflection): NOT_SERVING until the loop is connected to the
log and has caught up with it, and again whenever that stops being true. SIGTERM: the
runtime reports NOT_SERVING, the loop checkpoints and commits, and the state file is closed.
A loop that dies of an unexpected error stops the process with a non-zero status, so that
its supervisor (``fraudmesh up``, Kubernetes) starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import grpc

from services.eventlog import EventLogSettings, open_consumer
from services.models.lifecycle import ModelLifecycle
from services.models.rollout import RolloutFile
from services.monitor.advice import Advisor
from services.monitor.controller import RolloutController
from services.monitor.engine import MonitorEngine
from services.monitor.loop import MonitorLoop
from services.monitor.metrics import MonitorMetrics
from services.monitor.references import ReferenceBook
from services.monitor.settings import MonitorSettings
from services.monitor.state import MonitorStore

log = logging.getLogger(__name__)


class MonitorApp:
    """Consumes decision and outcome events into drift and live-quality figures."""

    name = "monitor"

    def __init__(
        self,
        settings: MonitorSettings,
        events: EventLogSettings,
        metrics: MonitorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.events = events
        self.metrics = metrics or MonitorMetrics()
        self.engine: MonitorEngine | None = None
        self._store: MonitorStore | None = None
        self._loop: MonitorLoop | None = None
        self._thread: threading.Thread | None = None
        self._controller: threading.Thread | None = None
        self._stop = threading.Event()
        self.failed = False
        """Set when the loop thread died of an unexpected error (the exit status says so)."""

    def register(self, server: grpc.aio.Server) -> list[str]:
        """No RPC of its own: health and reflection only."""
        return []

    async def start(self) -> None:
        """Opens the state (off the event loop), then starts the loop thread."""
        await asyncio.to_thread(self._prepare)
        self._thread = threading.Thread(target=self._run_loop, name="monitor-loop", daemon=True)
        self._thread.start()
        assert self.engine is not None
        controller = RolloutController(
            self.engine,
            ModelLifecycle(self.settings.models_path, self.settings.model_name),
            RolloutFile(self.settings.models_path, self.settings.model_name),
            self.settings.slice_s,
            policy=self.settings.canary_policy,
        )
        self._controller = threading.Thread(
            target=controller.run,
            args=(self._stop, self.ready, self.settings.rollout_interval_s),
            name="rollout-controller",
            daemon=True,
        )
        self._controller.start()
        log.info(
            "monitor consuming",
            extra={"backend": self.events.backend, "group": self.settings.group},
        )

    def _prepare(self) -> None:
        s = self.settings
        self._store = MonitorStore(s.state_file)
        book = ReferenceBook(s.models_path, s.model_name)
        self.engine = MonitorEngine(self._store, book, s.policy())
        self._loop = MonitorLoop(
            s,
            lambda: open_consumer(self.events, s.group),
            self.engine,
            Advisor(s.advice_file, s.advice_policy()),
            self.metrics,
        )

    def _run_loop(self) -> None:
        assert self._loop is not None
        try:
            self._loop.run(self._stop)
        except BaseException:
            if self._stop.is_set():
                raise
            self.failed = True
            log.exception("the monitor loop died; stopping the process for a restart")
            os.kill(os.getpid(), signal.SIGTERM)

    def ready(self) -> bool:
        """Connected, caught up and the loop thread alive (the runtime follows this)."""
        thread, loop = self._thread, self._loop
        return thread is not None and thread.is_alive() and loop is not None and loop.ready()

    async def close(self) -> None:
        """Stops the loop after its last checkpoint and closes the state file."""
        self._stop.set()
        for thread in (self._thread, self._controller):
            if thread is not None:
                await asyncio.to_thread(thread.join)
        if self._store is not None:
            self._store.close()
