"""Brokers for the event log's tests (started once per session, on free ports) and settings
for a fresh log per test on each backend."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtest.brokers import KafkaBroker, RedisServer, kafka_available
from services.eventlog import Consumer, EventLogSettings, Record

REPO = Path(__file__).resolve().parents[3]
BACKENDS = ("file", "redis", "kafka")

SettingsFactory = Callable[..., EventLogSettings]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server with an append-only file, shared by the session."""
    server = RedisServer(tmp_path_factory.mktemp("eventlog-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A Kafka 4.x broker in KRaft mode, started once per session (about 10 s)."""
    if not kafka_available():
        pytest.fail("Java or the Kafka broker jars are missing: run `make test-brokers`")
    broker = KafkaBroker(tmp_path_factory.mktemp("eventlog-kafka"), quick_jit=True)
    broker.start()
    yield broker
    broker.stop()


def settings_factory(
    request: pytest.FixtureRequest, backend: str, var_dir: Path
) -> SettingsFactory:
    """Settings of a fresh topic on ``backend``; keyword arguments override fields."""
    base: dict[str, Any] = {
        "backend": backend,
        "var_dir": var_dir,
        "topic": f"t-{uuid.uuid4().hex[:12]}",
        "groups": (),
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.5,
        "file_poll_interval_ms": 2.0,
    }
    if backend == "redis":
        base["redis_url"] = request.getfixturevalue("redis_server").url
    elif backend == "kafka":
        base["kafka_bootstrap"] = request.getfixturevalue("kafka_broker").bootstrap
        base["kafka_partitions"] = 3
        base["send_timeout_s"] = 3.0

    def make(**overrides: Any) -> EventLogSettings:
        return EventLogSettings(**(base | overrides))

    return make


@pytest.fixture(params=BACKENDS)
def log_settings(request: pytest.FixtureRequest, tmp_path: Path) -> SettingsFactory:
    """The contract suite's backend: every test runs on the file log, Redis and Kafka."""
    return settings_factory(request, str(request.param), tmp_path)


def drain(consumer: Consumer, want: int, timeout_s: float = 60.0) -> list[Record]:
    """Polls until ``want`` records came or ``timeout_s`` passed, asking for no more than that."""
    got: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll(min(500, want - len(got)), 0.5)
    return got


def start_worker(settings: EventLogSettings, *args: str, log_path: Path) -> subprocess.Popen[str]:
    """``python -m tests.integration.eventlog.worker`` on these settings; stdout is piped."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.eventlog.worker",
            "--settings",
            settings.model_dump_json(),
            *args,
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log_path.open("w"),
        text=True,
    )


def read_json_lines(
    proc: subprocess.Popen[str], until: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Reads the worker's JSON lines until one satisfies ``until``; fails if it exits first."""
    assert proc.stdout is not None
    for line in proc.stdout:
        message = json.loads(line)
        if until(message):
            return message
    raise AssertionError(f"worker exited with {proc.wait()} before the expected line")
