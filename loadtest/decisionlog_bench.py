"""Benchmark of the decision sink: how fast it writes, what it costs, how late events land.

    python -m loadtest.decisionlog_bench [--backends file,redis,kafka] [--burst 50000]
                                         [--rate 400] [--seconds 30]

For each backend (redis-server and a Kafka broker are started here on free ports; the broker
needs ``make test-brokers``) a real sink process (``python -m services.decisionlog``, default
settings: 5 s flush interval, zstd) runs on a fresh topic, and this process produces
realistic ``DecisionEvent``s (``eventlog_bench.build_event``):

- burst: ``--burst`` events put on the log while the sink is stopped (SIGSTOP), then the sink
  resumed: events/s until it has read them all (catching up with a backlog; full parts are
  written on the way, the last one when the flush timer fires), and its CPU per event until
  every one is durable (its /proc stat);
- steady: ``--rate`` events/s for ``--seconds``; the sink's CPU as a share of one core, its
  flush duration (write + fsync + rename + commit, from its histogram), bytes per event on
  disk, and the write delay of every event: the modification time of the part that holds it
  minus its ``decided_at`` (p50 / p99 / max), which the flush interval bounds.

The table goes to ``loadtest/results/decisionlog.{md,json}`` (``--out``), with provenance.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry

from loadtest import provenance
from loadtest.brokers import wait_until
from loadtest.eventlog_bench import backend_settings, build_event
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.common.settings import to_env
from services.decisionlog import layout
from services.decisionlog.settings import DecisionLogSettings
from services.domain import metrics
from services.eventlog import EventLogMetrics, EventLogSettings, open_producer
from services.mesh import Process, free_port, grpc_serving

_TICKS = os.sysconf("SC_CLK_TCK")
RESULTS = Path(__file__).with_name("results")
LOG_FIELDS = (
    "backend",
    "topic",
    "var_dir",
    "redis_url",
    "kafka_bootstrap",
    "kafka_partitions",
    "consumer_name",
    "kafka_session_timeout_ms",
)
"""The event log settings a sink process is given (the rest are the defaults)."""


@dataclass(frozen=True)
class Result:
    """One backend's figures."""

    backend: str
    burst_events_per_s: float
    burst_cpu_us_per_event: float
    steady_rate: float
    steady_cpu_share: float
    steady_cpu_us_per_event: float
    flush_ms_mean: float
    bytes_per_event: float
    delay_p50_s: float
    delay_p99_s: float
    delay_max_s: float


class SinkProcess:
    """A sink process on a topic, with its /metrics and its CPU time."""

    def __init__(self, log: EventLogSettings, root: Path, logs: Path, **sink: object) -> None:
        self.root = root
        self.port = free_port()
        self.metrics_port = free_port()
        env = {
            **to_env(EventLogSettings, **{f: getattr(log, f) for f in LOG_FIELDS}),
            **to_env(
                DecisionLogSettings,
                port=self.port,
                metrics_port=self.metrics_port,
                root=root,
                **sink,
            ),
        }
        self.process = Process(
            "decisionlog",
            [sys.executable, "-m", "services.decisionlog"],
            ready=lambda: grpc_serving(f"127.0.0.1:{self.port}"),
            env=env,
            log_path=logs / f"sink-{log.backend}.log",
        )

    def __enter__(self) -> SinkProcess:
        self.process.start()
        self.process.wait_ready(120)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop(30)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process so far (every thread)."""
        assert self.process.pid is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def metric(self, metric: scrape.Metric) -> float:
        """The sum of a metric's samples."""
        return scrape.fetch(scrape.url("127.0.0.1", self.metrics_port)).sum(metric)


def measure(
    settings: EventLogSettings,
    work: Path,
    burst: int,
    rate: float,
    seconds: float,
    **sink_settings: object,
) -> Result:
    """Burst, then steady rate, on one sink process."""
    root = work / "decisions"
    producer = open_producer(settings, EventLogMetrics(CollectorRegistry()))
    with SinkProcess(settings, root, work / "logs", **sink_settings) as sink:
        written = catalogue.DECISIONLOG_EVENTS_WRITTEN
        # The burst goes onto the log while the sink is stopped (SIGSTOP): what follows
        # measures the sink catching up with a backlog, not the producer.
        sink.process.signal(signal.SIGSTOP)
        try:
            for i in range(burst):
                producer.append(build_event(i))
            assert producer.flush(300), "burst not delivered"
        finally:
            sink.process.signal(signal.SIGCONT)
        cpu0, t0 = sink.cpu_s(), time.perf_counter()
        read = catalogue.DECISIONLOG_EVENTS
        assert wait_until(lambda: sink.metric(read) >= burst, 600, 0.02), "burst not read"
        burst_s = time.perf_counter() - t0
        # The last part waits for the flush timer: the CPU counts its writing too.
        assert wait_until(lambda: sink.metric(written) >= burst, 600, 0.05), "burst not written"
        burst_cpu = sink.cpu_s() - cpu0
        # Wait for the flush timer to go quiet, then measure the steady rate alone.
        time.sleep(6)
        flushes0 = sink.metric(catalogue.DECISIONLOG_FLUSH_SECONDS.count)
        flush_s0 = sink.metric(catalogue.DECISIONLOG_FLUSH_SECONDS.sum)
        bytes0 = sink.metric(catalogue.DECISIONLOG_BYTES_WRITTEN)
        parts_before = set(all_parts(root))
        cpu1, t1 = sink.cpu_s(), time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) < t1 + seconds:
            due = int((now - t1) * rate)
            while sent < due:
                producer.append(build_event(burst + sent))
                sent += 1
            time.sleep(0.002)
        assert wait_until(lambda: sink.metric(written) >= burst + sent, 120, 0.05)
        steady_wall, steady_cpu = time.perf_counter() - t1, sink.cpu_s() - cpu1
        flushes = sink.metric(catalogue.DECISIONLOG_FLUSH_SECONDS.count) - flushes0
        flush_s = sink.metric(catalogue.DECISIONLOG_FLUSH_SECONDS.sum) - flush_s0
        steady_bytes = sink.metric(catalogue.DECISIONLOG_BYTES_WRITTEN) - bytes0
    producer.close()
    delays = sorted(d for part, d in delays_by_part(root) if part not in parts_before)
    return Result(
        backend=settings.backend,
        burst_events_per_s=burst / burst_s,
        burst_cpu_us_per_event=burst_cpu / burst * 1e6,
        steady_rate=sent / seconds,
        steady_cpu_share=steady_cpu / steady_wall,
        steady_cpu_us_per_event=steady_cpu / max(sent, 1) * 1e6,
        flush_ms_mean=flush_s / max(flushes, 1) * 1e3,
        bytes_per_event=steady_bytes / max(sent, 1),
        delay_p50_s=metrics.percentile(delays, 50),
        delay_p99_s=metrics.percentile(delays, 99),
        delay_max_s=delays[-1],
    )


def all_parts(root: Path) -> list[Path]:
    """Every decisions part so far."""
    return [p for _, d in layout.day_dirs(root, "decisions") for p in layout.parts(d)]


def delays_by_part(root: Path) -> list[tuple[Path, float]]:
    """(part, delay) per event: the part's modification time minus the event's decided_at."""
    pairs: list[tuple[Path, float]] = []
    for part in all_parts(root):
        landed = part.stat().st_mtime
        decided = pq.read_table(part, columns=["decided_at"]).column(0)
        seconds = pc.divide(decided.cast("int64"), 1e6).to_pylist()
        pairs += [(part, landed - s) for s in seconds if s is not None]
    return pairs


def markdown(results: list[Result]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| backend | burst events/s | burst CPU µs/event | steady rate | sink CPU (share of a core) "
        "| CPU µs/event | flush ms (mean) | bytes/event | write delay p50 / p99 / max s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.backend} | {r.burst_events_per_s:,.0f} | {r.burst_cpu_us_per_event:.1f} "
            f"| {r.steady_rate:.0f}/s | {r.steady_cpu_share:.1%} | {r.steady_cpu_us_per_event:.1f} "
            f"| {r.flush_ms_mean:.1f} | {r.bytes_per_event:.0f} "
            f"| {r.delay_p50_s:.2f} / {r.delay_p99_s:.2f} / {r.delay_max_s:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Runs the benchmark and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="file,redis,kafka")
    parser.add_argument("--burst", type=int, default=50_000, help="events of the burst")
    parser.add_argument("--rate", type=float, default=400.0, help="steady events per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the steady run")
    parser.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a DecisionLogSettings field for the sink (repeatable), e.g. poll_linger_s=0",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "decisionlog")
    args = parser.parse_args()
    sink_settings = dict(item.split("=", 1) for item in args.sink)
    results = []
    with tempfile.TemporaryDirectory(prefix="decisionlog-bench-") as tmp:
        for backend in args.backends.split(","):
            work = Path(tmp) / backend
            with backend_settings(backend, work) as settings:
                result = measure(
                    settings, work, args.burst, args.rate, args.seconds, **sink_settings
                )
            results.append(result)
            print(f"{backend}: {result}", flush=True)
    text = "\n".join(
        [
            "# The decision sink: a backlog, then a steady rate",
            "",
            f"Per backend a real sink process with its default settings"
            f"{' and ' + ', '.join(args.sink) if args.sink else ''}: a burst of "
            f"{args.burst:,} events put on the log while it was stopped, then {args.rate:.0f} "
            f"events/s for {args.seconds:.0f} s.",
            "",
            markdown(results),
            "",
        ]
    )
    data = {
        "burst": args.burst,
        "rate": args.rate,
        "seconds": args.seconds,
        "sink": sink_settings,
        "backends": {r.backend: dataclasses.asdict(r) for r in results},
    }
    paths = provenance.write(args.out, data, text, provenance.record())
    print(text)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
