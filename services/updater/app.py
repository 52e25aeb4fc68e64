"""The live feature updater as a Service for the shared runtime.

Start: open the state file (a file of the format before terminals is migrated, its terminal
states seeded from the history), seed it from the dataset's history when it is new or the
dataset changed (``seed.py``), open the online-store writer, and run the consume loop
(``loop.py``) on its own thread. The server only answers health checks (and reflection):
NOT_SERVING until the loop is connected to the log and the store and has caught up with the
log, and again whenever that stops being true. SIGTERM: the runtime reports NOT_SERVING,
the loop finishes its batch, writes its rows, checkpoints and commits, and the files and
connections are closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from fraud.v1 import events_pb2
from services.domain.lists import ListEntry
from services.eventlog import EventLogSettings, audit, open_consumer
from services.featurestore import layout
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.featurestore.writer import OnlineFeatureWriter
from services.updater import partitioned, partitions, seed
from services.updater.engine import LiveAggregator
from services.updater.expiry import ACTOR, ListExpiry
from services.updater.loop import UpdateLoop
from services.updater.metrics import UpdaterMetrics
from services.updater.settings import UpdaterSettings
from services.updater.state import TERMINALS_SEEDED, StateStore

log = logging.getLogger(__name__)

SEED_KEY = "seed"
"""Meta key of the state file: fingerprint of the dataset the states were seeded from."""


class UpdaterApp:
    """Consumes decision and outcome events into the online store's card, merchant and
    terminal rows."""

    name = "updater"

    def __init__(
        self,
        settings: UpdaterSettings,
        store: FeatureStoreSettings,
        events: EventLogSettings,
        metrics: UpdaterMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.events = events
        self.metrics = metrics or UpdaterMetrics()
        self._state: StateStore | None = None
        self._writer: OnlineFeatureWriter | None = None
        self._loop: UpdateLoop | partitioned.PartitionedLoop | None = None
        self._thread: threading.Thread | None = None
        self._expiry: ListExpiry | None = None
        self._closers: list[Callable[[], None]] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.failed = False
        """Set when the loop thread died of an unexpected error (the exit status says so)."""
        self._stop = threading.Event()

    def register(self, server: grpc.aio.Server) -> list[str]:
        """No RPC of its own: health and reflection only."""
        return []

    async def start(self) -> None:
        """Prepares the state and the store (off the event loop), then starts the loop thread."""
        await asyncio.to_thread(self._prepare)
        assert self._loop is not None
        self._thread = threading.Thread(target=self._run_loop, name="updater-loop", daemon=True)
        self._thread.start()
        if self._expiry is not None:
            self._sweeper = asyncio.create_task(self._sweep(self._expiry))
        log.info(
            "updater consuming",
            extra={"backend": self.events.backend, "group": self.settings.group},
        )

    def _run_loop(self) -> None:
        """The loop thread. The loop handles every failure it knows (log, store, state) by
        retrying; anything else is a defect, and an updater that stays up without its loop
        would only report not-ready forever: the process stops in order (what was applied
        is checkpointed, the log gives the rest again) and exits non-zero, so its supervisor
        (``fraudmesh up``, Kubernetes) starts it again."""
        assert self._loop is not None
        try:
            self._loop.run(self._stop)
        except BaseException:
            if self._stop.is_set():
                raise
            self.failed = True
            log.exception("the updater loop died; stopping the process for a restart")
            os.kill(os.getpid(), signal.SIGTERM)

    async def _sweep(self, expiry: ListExpiry) -> None:
        """Sweeps the lists' expired entries every ``list_sweep_s`` until closed; a failed
        sweep (store or log down) is logged and tried again on the next."""
        while not self._closing.is_set():
            try:
                await asyncio.wait_for(self._closing.wait(), self.settings.list_sweep_s)
                return
            except TimeoutError:
                pass
            loop = self._loop
            if isinstance(loop, partitioned.PartitionedLoop) and not loop.sweeps:
                continue  # one member of a group sweeps: the owner of the log's partition 0
            try:
                await asyncio.to_thread(expiry.sweep, time.time())
            except Exception:
                log.warning("cannot sweep the lists' expired entries; trying again", exc_info=True)

    @staticmethod
    def _expiry_envelope(entry: ListEntry, generation: int) -> events_pb2.EventEnvelope:
        assert entry.expires_at_s is not None
        return audit.entry_change("expire", entry, generation, entry.expires_at_s, ACTOR)

    def _prepare(self) -> None:
        s = self.settings
        if s.list_sweep_s > 0:
            lists = open_lists(self.store, timeout_s=s.store_timeout_ms / 1000)
            assert lists is not None
            self._closers.append(lists.close)
            self._expiry = ListExpiry(
                lists, lambda envelope: audit.write(self.events, envelope), self._expiry_envelope
            )
        if s.partitioned:
            self._prepare_member()
            return
        state = StateStore(s.state_file)
        self._state = state
        if s.seed:
            self._seed(state)
        self._writer = OnlineFeatureWriter(self.store, timeout_ms=s.store_timeout_ms)
        aggregator = LiveAggregator(state, s.cache_max_entities, s.max_pending_labels)
        # A `features materialize` since the last run wrote batch rows over the live ones:
        # the loop writes these first.
        restored = aggregator.restore_live_rows()
        if restored:
            log.info("rewriting the rows of entities live events changed", extra=restored)
        self._loop = UpdateLoop(
            s,
            lambda: open_consumer(self.events, s.group),
            self._writer,
            aggregator,
            self.metrics,
        )

    def _prepare_member(self) -> None:
        """A member of a partitioned group: the shared seed (built by the first member to
        start, under a lock), then the partitioned loop (``partitioned.py``)."""
        s = self.settings
        if self.events.backend != "kafka":
            raise ValueError(
                "FRAUD_UPDATER_PARTITIONED needs the Kafka event log (FRAUD_EVENTLOG_BACKEND="
                f"kafka): the {self.events.backend} log has no partitions to own"
            )
        directory = s.partition_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / partitions.BASE_FILE
        data = self.store.data_path / layout.TRANSACTIONS_FILE
        current = seed.fingerprint(data) if data.is_file() else "none"
        with partitions.seed_lock(directory):
            held = self._seeded_as(path)
            # Every member reads the seed, on whatever host, and none writes it once built:
            # it is opened for writing only when it must be built (again).
            if not path.exists() or (s.seed and held != current):
                if held is not None and held != current:
                    partitions.discard_partitions(directory)
                base = StateStore(path)
                if s.seed:
                    self._seed(base)
                base.seal()
        base = StateStore.frozen(path)
        self._state = base
        self._writer = OnlineFeatureWriter(self.store, timeout_ms=s.store_timeout_ms)
        self._loop = partitioned.PartitionedLoop(s, self.events, self._writer, base, self.metrics)

    @staticmethod
    def _seeded_as(path: Path) -> str | None:
        """The dataset fingerprint a group's seed was built from (None: not built)."""
        if not path.exists():
            return None
        frozen = StateStore.frozen(path)
        try:
            return frozen.meta(SEED_KEY)
        except sqlite3.OperationalError:  # a file left without its tables
            return None
        finally:
            frozen.close()

    def _seed(self, state: StateStore) -> None:
        """Seeds the states from the dataset's transactions unless they already come from it."""
        import pandas as pd

        path = self.store.data_path / layout.TRANSACTIONS_FILE
        current = seed.fingerprint(path) if path.is_file() else "none"
        held = state.meta(SEED_KEY)
        if held == current:
            if state.meta(TERMINALS_SEEDED) is None:
                self._seed_terminals(state, path, current)
            log.info("entity states resume", extra=state.counts())
            return
        if held is not None:
            log.warning(
                "the dataset changed since the states were seeded: rebuilding them from it",
                extra={"was": held, "now": current},
            )
            state.reset()
        if current == "none":
            log.warning("no dataset: live rows start without batch history", extra={"path": path})
        else:
            history = seed.replay(pd.read_parquet(path))
            state.save(
                cards=((k, s.to_bytes()) for k, s in history.cards.items()),
                merchants=((k, s.to_bytes()) for k, s in history.merchants.items()),
                terminals=((k, s.to_bytes()) for k, s in history.terminals.items()),
                transactions=history.transactions,
                live=False,
                due=history.due,
            )
        state.set_meta(SEED_KEY, current)
        state.set_meta(TERMINALS_SEEDED, current)

    def _seed_terminals(self, state: StateStore, path: Path, current: str) -> None:
        """Seeds the terminal states of a file that has none (written before terminals were
        kept): the live card and merchant states stay, the terminals start from the history.

        Decisions the earlier version applied are not in the terminal states (it kept none),
        except those its journal still holds, which are applied again at start; the online
        terminal rows are the materialized batch rows until each terminal's next event."""
        import pandas as pd

        log.warning(
            "the state file has no terminal states: seeding them from the history; "
            "decisions applied before this version count in the terminals' rows only from "
            "the batch tables",
            extra={"migrated_from_format": state.migrated_from, "dataset": current},
        )
        if current != "none":
            history = seed.replay(pd.read_parquet(path), terminals_only=True)
            state.save(
                terminals=((k, s.to_bytes()) for k, s in history.terminals.items()),
                transactions=history.transactions,
                live=False,
                due=history.due,
            )
        state.set_meta(TERMINALS_SEEDED, current)

    def ready(self) -> bool:
        """Connected, caught up and the loop thread alive (the runtime follows this)."""
        thread, loop = self._thread, self._loop
        return thread is not None and thread.is_alive() and loop is not None and loop.ready()

    async def close(self) -> None:
        """Stops the loop after its last checkpoint and closes the store and the state file."""
        # A sweep under way finishes first: the store it writes is closed below.
        self._closing.set()
        if self._sweeper is not None:
            await self._sweeper
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._writer is not None:
            self._writer.close()
        if self._state is not None:
            self._state.close()
        for close in self._closers:
            close()
