"""Micro-benchmark of the event log producer: CPU per append and throughput, per backend.

    python -m loadtest.eventlog_bench [--backends file,redis,kafka] [--rate 400] [--seconds 5]

For each backend (redis-server and a Kafka broker are started here on free ports; the broker
needs ``make test-brokers``) it measures, on a realistic ``DecisionEvent``:

- build: CPU to fill the event (the gateway's work, shown for scale);
- append: CPU on the caller's thread per ``Producer.append`` (serialize + enqueue): in a burst
  (warm caches) and at a paced rate (the median of ``--repeat`` runs; each append follows a
  sleep, so its caches are cold): what the gateway's event loop pays per decision;
- background: CPU per event of every other thread of the process at that rate (the sender
  thread, the client library's threads), from /proc/self/task/*/schedstat;
- total: append + background, what emitting costs the gateway process per decision;
- throughput: events per second appended in a burst and delivered (``flush``);
- delivery latency: from ``append`` to a consumer's ``poll`` returning the event, p50 and p99,
  at the paced rate on a fresh topic (producer and consumer in this process).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2, scoring_pb2
from loadtest.brokers import KafkaBroker, RedisServer
from services.domain import featurespec, metrics
from services.eventlog import (
    EventLogMetrics,
    EventLogSettings,
    events,
    open_consumer,
    open_producer,
)

_FEATURES = [float(i) * 1.5 for i in range(len(featurespec.MODEL_FEATURES))]
_SCHEMA = events.feature_schema_id(featurespec.MODEL_FEATURES)


def build_event(i: int) -> events_pb2.EventEnvelope:
    """A decision event as the gateway would fill it."""
    envelope = events_pb2.EventEnvelope()
    d = envelope.decision
    d.event_id = events.new_event_id()
    d.transaction_id = f"tx-{i:012d}"
    d.card_id = f"card-{i % 5000:06d}"
    d.merchant_id = "merch-00042"
    d.amount_minor = 1234 + i % 1000
    d.currency = "EUR"
    now = time.time_ns()
    d.timestamp.FromNanoseconds(now)
    d.card_not_present = i % 3 == 0
    d.features.extend(_FEATURES)
    d.feature_schema = _SCHEMA
    d.feature_source = scoring_pb2.FEATURE_SOURCE_ONLINE
    d.score = 0.0123
    d.decision = scoring_pb2.DECISION_APPROVE
    d.scored_by = scoring_pb2.SCORED_BY_MODEL
    d.model_version = "20251123-0001"
    d.route = events_pb2.ROUTE_LIVE
    d.reasons.append("score below the review threshold")
    d.elapsed_ms = 3.21
    d.decided_at.FromNanoseconds(now)
    return envelope


@dataclass(frozen=True)
class Result:
    """Figures of one backend."""

    backend: str
    build_us: float
    warm_append_us: float
    append_us: float
    background_us: float
    throughput: float
    event_bytes: int
    latency_p50_ms: float
    latency_p99_ms: float

    @property
    def total_us(self) -> float:
        """CPU of the whole process per event."""
        return self.append_us + self.background_us


def other_threads_cpu_s() -> float:
    """CPU seconds of every thread of this process but the main one (Linux schedstat, ns)."""
    main = os.getpid()
    total = 0
    for task in os.listdir("/proc/self/task"):
        if int(task) == main:
            continue
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int(Path(f"/proc/self/task/{task}/schedstat").read_text().split()[0])
    return total / 1e9


def paced(rate: float, seconds: float, work: Callable[[int], object]) -> tuple[int, float, float]:
    """Calls ``work(i)`` ``rate`` times a second for ``seconds``; returns (calls, main-thread
    CPU seconds spent inside ``work``, CPU seconds of the other threads meanwhile)."""
    n = int(rate * seconds)
    interval = 1.0 / rate
    inside = 0.0
    others = other_threads_cpu_s()
    start = time.monotonic()
    for i in range(n):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t0 = time.thread_time()
        work(i)
        inside += time.thread_time() - t0
    return n, inside, other_threads_cpu_s() - others


def delivery_latency(settings: EventLogSettings, rate: float, seconds: float) -> list[float]:
    """Seconds from append to poll of every event appended at ``rate`` on a fresh topic."""
    settings = settings.model_copy(update={"topic": f"{settings.topic}-latency"})
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    consumer = open_consumer(settings, "latency")
    latencies: list[float] = []
    expected = int(rate * seconds) + 1
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set() and len(latencies) < expected:
            for record in consumer.poll(500, 0.1):
                sent = record.envelope().decision.decided_at.ToNanoseconds()
                latencies.append((time.time_ns() - sent) / 1e9)

    try:
        producer.append(build_event(0))  # the first one waits for the group to form
        reader = threading.Thread(target=consume, name="latency-consumer")
        reader.start()
        deadline = time.monotonic() + 120
        while not latencies and time.monotonic() < deadline:
            time.sleep(0.05)
        latencies.clear()
        expected -= 1
        paced(rate, seconds, lambda i: producer.append(build_event(i)))
        reader.join(60)
    finally:
        stop.set()
        producer.close()
        consumer.close()
    return latencies


def measure(
    settings: EventLogSettings, rate: float, seconds: float, burst: int, repeat: int = 3
) -> Result:
    """The figures of one backend (see the module docstring)."""
    prebuilt = [build_event(i) for i in range(2000)]
    t0 = time.thread_time()
    for i in range(2000):
        build_event(i)
    build_us = (time.thread_time() - t0) / 2000 * 1e6

    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    try:
        for event in prebuilt[:200]:  # connect, create the topic, warm up
            producer.append(event)
        if not producer.flush(60):
            raise RuntimeError(f"{settings.backend}: warm-up not delivered: {producer.stats}")
        # The machine is shared: the median of a few paced runs is steadier than one.
        appends, backgrounds = [], []
        for _ in range(repeat):
            n, inside, background = paced(
                rate, seconds, lambda i: producer.append(prebuilt[i % 2000])
            )
            if not producer.flush(60):
                raise RuntimeError(f"{settings.backend}: paced events not delivered")
            appends.append(inside / n * 1e6)
            backgrounds.append(background / n * 1e6)
        append_us = statistics.median(appends)
        background_us = statistics.median(backgrounds)

        start = time.perf_counter()
        cpu0 = time.thread_time()
        for i in range(burst):
            producer.append(prebuilt[i % 2000])
        warm_append_us = (time.thread_time() - cpu0) / burst * 1e6
        if not producer.flush(300):
            raise RuntimeError(f"{settings.backend}: burst not delivered")
        throughput = burst / (time.perf_counter() - start)
        stats = producer.stats
        if stats.spilled or stats.dropped:
            raise RuntimeError(f"{settings.backend}: spilled or dropped during the run: {stats}")
    finally:
        producer.close()
    latencies = delivery_latency(settings, rate, seconds)
    return Result(
        settings.backend,
        build_us,
        warm_append_us,
        append_us,
        background_us,
        throughput,
        len(prebuilt[0].SerializeToString()),
        metrics.percentile(latencies, 50) * 1e3,
        metrics.percentile(latencies, 99) * 1e3,
    )


@contextlib.contextmanager
def backend_settings(backend: str, root: Path, **overrides: Any) -> Iterator[EventLogSettings]:
    """Settings of a fresh topic on ``backend``, with its server running meanwhile."""
    fields: dict[str, Any] = {
        "backend": backend,
        "var_dir": root,
        "topic": f"bench-{uuid.uuid4().hex[:8]}",
        "groups": (),
        **overrides,
    }
    if backend == "redis":
        server = RedisServer(root / "redis")
        server.start()
        try:
            yield EventLogSettings(**fields, redis_url=server.url)
        finally:
            server.stop()
    elif backend == "kafka":
        broker = KafkaBroker(root / "kafka")
        broker.start()
        try:
            yield EventLogSettings(**fields, kafka_bootstrap=broker.bootstrap, kafka_partitions=6)
        finally:
            broker.stop()
    else:
        yield EventLogSettings(**fields)


def markdown(results: list[Result], rate: float) -> str:
    """The results as a Markdown table."""
    lines = [
        f"| backend | build µs | append µs in a burst | append µs at {rate:.0f}/s "
        "| background µs/event | total µs/event | burst events/s | append→poll p50 / p99 ms "
        "| event bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {r.build_us:.1f} | {r.warm_append_us:.1f} | {r.append_us:.1f} "
            f"| {r.background_us:.1f} "
            f"| {r.total_us:.1f} | {r.throughput:,.0f} "
            f"| {r.latency_p50_ms:.1f} / {r.latency_p99_ms:.1f} | {r.event_bytes} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Runs the benchmark and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="file,redis,kafka")
    parser.add_argument("--rate", type=float, default=400.0, help="paced appends per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the paced run")
    parser.add_argument("--burst", type=int, default=50_000, help="events of the burst")
    parser.add_argument("--repeat", type=int, default=3, help="paced runs (median reported)")
    parser.add_argument(
        "--file-fsync", default=None, choices=("batch", "interval", "never"), help="file log"
    )
    parser.add_argument("--linger-ms", type=float, default=None, help="producer linger")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="eventlog-bench-") as tmp:
        for backend in args.backends.split(","):
            overrides: dict[str, Any] = {}
            if args.linger_ms is not None:
                overrides["linger_ms"] = args.linger_ms
            if backend == "file" and args.file_fsync is not None:
                overrides["file_fsync"] = args.file_fsync
            with backend_settings(backend, Path(tmp) / backend, **overrides) as settings:
                result = measure(settings, args.rate, args.seconds, args.burst, args.repeat)
            results.append(result)
            print(f"{backend}: {result}", flush=True)
    print(markdown(results, args.rate))


if __name__ == "__main__":
    main()
