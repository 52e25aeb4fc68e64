"""Event-log brokers as local processes for tests and benchmarks: redis-server and a Kafka 4.x
broker in KRaft mode from the Maven Central jars that ``make test-brokers`` puts in build/kafka.

Both run on 127.0.0.1 ports and a data folder of their own, can be stopped and started again
on the same ports and data (an outage and a recovery), and are stopped by PID.

They live in the load-test suite, not under tests/, because the event-log benchmark starts them
too: the tests may import the suite, the suite never imports the tests, and the product (which
runs against managed brokers) ships neither. The pytest fixtures built on them are the tests'
own (tests/integration/eventlog/conftest.py).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.mesh import Process, free_port, tcp_open

REPO = Path(__file__).resolve().parents[1]
KAFKA_LIBS = REPO / "build" / "kafka" / "libs"
"""Where scripts/test-brokers.sh puts the broker's jars."""

_JVM_FLAGS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)
QUICK_JIT = ("-XX:TieredStopAtLevel=1",)
"""JIT flags of a broker that lives for a test, not a benchmark: the client compiler only. It
answers sooner and spends about a third less CPU over its first minute and a half, start,
20,000 messages through and idle time (6.5 against 9.9 CPU seconds, two runs each), at the
cost of the server compiler's peak throughput, which a benchmark's broker keeps."""
QUIET_METADATA = {"metadata.max.idle.interval.ms": "0"}
"""Settings of a test broker: its controller appends no no-op record to the metadata log
every 500 ms (Kafka's default; 0 turns them off). They let the brokers of a cluster see an
idle controller alive; a test broker is its own controller, and they were a third of its idle
CPU: 48 against 32 ms/s over 25 s idle, three alternating rounds on 2 cores. The test suite
keeps some brokers up for most of a run."""


def kraft_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64, never starting with '-'.

    Kafka's own ``Uuid.randomUuid`` draws again for ids that start with '-', since command
    lines would read them as options; a random id does so one time in 64.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_available() -> bool:
    """True when Java and the broker jars are installed."""
    return shutil.which("java") is not None and any(KAFKA_LIBS.glob("kafka_2.13-*.jar"))


@dataclass
class RedisServer:
    """A redis-server with an append-only file, so that a restart keeps the streams."""

    root: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    process: Process | None = None

    @property
    def url(self) -> str:
        """redis:// URL of the server."""
        return f"redis://{self.host}:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> None:
        """Starts the server (again) on its port and data folder; returns once it answers."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed: run `make test-brokers`")
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            "redis-server",
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(data),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--protected-mode", "yes",
        ]  # fmt: skip
        self.process = Process(
            "redis",
            argv,
            ready=self._answers,
            log_path=self.root / "redis.log",
        )
        self.process.start()
        self.process.wait_ready(timeout_s)

    def _answers(self) -> bool:
        """True once the server answers PING: a restarted server accepts connections while it
        still loads its append-only file, and answers every command LOADING until done."""
        if not tcp_open(self.host, self.port):
            return False
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM (redis writes its append-only file), then SIGKILL if it will not go."""
        if self.process is not None:
            self.process.stop()


@dataclass
class KafkaBroker:
    """One Kafka broker that is also its own KRaft controller."""

    root: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    process: Process | None = None
    quick_jit: bool = False
    """Starts with ``QUICK_JIT`` and ``QUIET_METADATA``: for tests, whose brokers live briefly
    and carry little."""

    @property
    def bootstrap(self) -> str:
        """bootstrap.servers of the broker."""
        return f"{self.host}:{self.port}"

    def _properties(self) -> Path:
        data = self.root / "data"
        path = self.root / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            # One broker: every internal topic with one replica, and few partitions so that
            # the first consumer group starts in well under a second.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        if self.quick_jit:
            settings |= QUIET_METADATA
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _java(self, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None or not kafka_available():
            raise RuntimeError("Java or the Kafka broker jars are missing: run `make test-brokers`")
        flags = (*_JVM_FLAGS, *(QUICK_JIT if self.quick_jit else ()))
        return [java, *flags, "-cp", f"{KAFKA_LIBS}/*", *args]

    def format(self) -> None:
        """Writes server.properties and formats the storage (once per data folder)."""
        properties = self._properties()
        if (self.root / "data" / "meta.properties").exists():
            return
        result = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                f"--cluster-id={kraft_cluster_id()}",
                "-c",
                str(properties),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise RuntimeError(
                f"formatting the Kafka storage in {self.root} failed: {' | '.join(detail)}"
            )

    def start(self, timeout_s: float = 120.0) -> None:
        """Starts the broker (again) on its ports and data; returns once it answers metadata."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.format()
        self.process = Process(
            "kafka",
            self._java("kafka.Kafka", str(self.root / "server.properties")),
            ready=self._ready,
            log_path=self.root / "broker.log",
        )
        self.process.start()
        self.process.wait_ready(timeout_s)

    def _ready(self) -> bool:
        if not tcp_open(self.host, self.port):
            return False
        from confluent_kafka.admin import AdminClient

        try:
            metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:
            return False
        return bool(metadata.brokers)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it will not go."""
        if self.process is not None:
            self.process.stop(timeout_s)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Polls ``predicate()`` until it is true or ``timeout_s`` passes; returns the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
