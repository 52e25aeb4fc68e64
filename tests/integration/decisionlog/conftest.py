"""The decision sink as a real process on each event-log backend, and what it wrote.

The brokers are the event log's session fixtures (a redis-server with an append-only file,
a Kafka 4.x broker in KRaft mode); each test gets a fresh topic and a fresh log folder.
"""

from __future__ import annotations

import collections
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from loadtest.brokers import wait_until
from loadtest.decisionlog_bench import LOG_FIELDS
from services.common import scrape
from services.common.settings import to_env
from services.decisionlog import layout
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog import EventLogSettings
from services.mesh import Process, free_port, grpc_serving
from tests.integration.eventlog.conftest import (  # noqa: F401 - fixtures used by the tests here
    BACKENDS,
    kafka_broker,
    redis_server,
    settings_factory,
)

LogFactory = Callable[..., EventLogSettings]

_LOG_FIELDS = (*LOG_FIELDS, "send_timeout_s", "retry_backoff_s", "retry_backoff_max_s")


@pytest.fixture(params=BACKENDS)
def log_settings(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    """A fresh topic on each backend in turn (file, redis, kafka)."""
    return settings_factory(request, str(request.param), tmp_path)


@dataclass
class Sink:
    """One ``python -m services.decisionlog`` process on a log; restartable on the same state."""

    log: EventLogSettings
    root: Path
    logs: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: Process | None = None
    starts: int = 0
    group: str = field(default_factory=lambda: f"decisionlog-{uuid.uuid4().hex[:8]}")
    """A consumer group of its own: tests share one Kafka broker, and each test's sink reads
    its own topic from the start."""

    def env(self) -> dict[str, str]:
        log_env = to_env(EventLogSettings, **{f: getattr(self.log, f) for f in _LOG_FIELDS})
        sink_env = to_env(
            DecisionLogSettings,
            port=self.port,
            metrics_port=self.metrics_port,
            root=self.root,
            log_json="false",
            **{
                "flush_interval_s": 0.5,
                "retry_backoff_s": 0.05,
                "group": self.group,
                **self.overrides,
            },
        )
        return {**log_env, **sink_env}

    def start(self, wait: bool = True, timeout_s: float = 120.0) -> None:
        """Starts the sink; with ``wait``, returns once it reports SERVING (caught up)."""
        self.starts += 1
        self.process = Process(
            "decisionlog",
            [sys.executable, "-m", "services.decisionlog"],
            ready=lambda: grpc_serving(f"127.0.0.1:{self.port}"),
            env=self.env(),
            log_path=self.logs / f"sink-{self.starts}.log",
        )
        self.process.start()
        if wait:
            self.process.wait_ready(timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        assert self.process is not None and self.process.popen is not None
        self.process.signal(signal.SIGKILL)
        self.process.popen.wait(30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit status."""
        return self.process.stop(timeout_s) if self.process is not None else None

    def metric(self, metric: scrape.Metric) -> float:
        """The sum of a metric's samples from /metrics (0 if absent)."""
        return scrape.fetch(scrape.url("127.0.0.1", self.metrics_port)).sum(metric)

    def written(self, kind: layout.Kind = "decisions") -> collections.Counter[str]:
        """How often each event id was written to a part of one table."""
        return written_ids(self.root, kind)


def written_ids(root: Path, kind: layout.Kind = "decisions") -> collections.Counter[str]:
    """How often each event id sits in the finished parts of one table."""
    counts: collections.Counter[str] = collections.Counter()
    for _, day_dir in layout.day_dirs(root, kind):
        for part in layout.parts(day_dir):
            counts.update(pq.read_table(part, columns=["event_id"]).column(0).to_pylist())
    return counts


def wait_written(
    root: Path, want: set[str], kind: layout.Kind = "decisions", timeout_s: float = 120
) -> None:
    """Waits until every id in ``want`` is in a part of ``kind``; fails with what is missing."""
    ok = wait_until(lambda: want <= set(written_ids(root, kind)), timeout_s, interval_s=0.2)
    assert ok, f"missing {sorted(want - set(written_ids(root, kind)))[:20]} …"


@pytest.fixture
def sink_factory(tmp_path: Path) -> Iterator[Callable[..., Sink]]:
    """Makes sinks on a log; every sink still running at the end is stopped."""
    made: list[Sink] = []

    def make(log: EventLogSettings, root: str = "decisions", **overrides: Any) -> Sink:
        sink = Sink(log, tmp_path / root, tmp_path / "logs" / log.consumer_name, overrides)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        if sink.process is not None and sink.process.alive():
            sink.process.stop(30)
