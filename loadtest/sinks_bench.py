"""How the decision log's writing scales with sinks: one sink against two in one consumer group.

    python -m loadtest.sinks_bench [--events 150000] [--rounds 3] [--sinks 1,2]

A Kafka broker is started here on free ports (``make test-brokers``); each measurement gets a
fresh topic of 6 partitions and a fresh log folder. The sinks (``python -m
services.decisionlog``, default settings, consumer names ``sink-a``, ``sink-b``, … in one
group) start on the empty topic and are stopped (SIGSTOP) once the group is stable and every
member owns partitions; ``--events`` realistic decision events (``eventlog_bench.build_event``) go onto the log meanwhile; then every sink is
resumed at once. Measured: the events read per second while the sinks read the middle of the
backlog (from a tenth of it read to nine tenths: the resumed fetches and the last
partition's tail are left out), the time until every event was read, and the sinks' CPU
per event until every event is durable (the parts of the last flush included). The sessions
last 60 s here, so that the pause does not end the members' sessions. The counts alternate within each round (1, 2, then 2, 1, …), and the ratio
is each round's. Results: ``loadtest/results/decision-sinks.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from loadtest import provenance
from loadtest.brokers import wait_until
from loadtest.decisionlog_bench import SinkProcess
from loadtest.eventlog_bench import backend_settings, build_event
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.decisionlog import layout
from services.eventlog import EventLogMetrics, EventLogSettings, open_producer

RESULTS = Path(__file__).with_name("results")
STEM = "decision-sinks"


@dataclass(frozen=True)
class Run:
    """One measurement: ``sinks`` sinks catching up with ``events`` events."""

    round: int
    sinks: int
    events: int
    read_s: float
    """From the resume until every event was read."""
    events_per_s: float
    """Read per second from a tenth of the backlog read to nine tenths."""
    cpu_us_per_event: float
    duplicates: int
    """Events written more than once (a rebalance during the run), 0 when the group held."""
    load_average: float


def written(root: Path) -> Counter[str]:
    """How often each event id is in the log's decision parts."""
    counts: Counter[str] = Counter()
    for _, day_dir in layout.day_dirs(root, "decisions"):
        for part in layout.parts(day_dir):
            counts.update(pq.read_table(part, columns=["event_id"]).column(0).to_pylist())
    return counts


def owners(settings: EventLogSettings, group: str) -> int:
    """How many members of a stable group own partitions (0 while it rebalances)."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    if described.state != ConsumerGroupState.STABLE:
        return 0
    return sum(1 for m in described.members if m.assignment and m.assignment.topic_partitions)


def measure(base: EventLogSettings, work: Path, sinks: int, events: int, round_: int) -> Run:
    """``sinks`` sinks in one group on a fresh 6-partition topic catch up with ``events``."""
    tag = uuid.uuid4().hex[:8]
    topic = base.model_copy(update={"topic": f"sinks-{tag}", "kafka_session_timeout_ms": 60_000})
    root = work / f"log-{tag}"
    producer = open_producer(topic, EventLogMetrics(CollectorRegistry()))
    with ExitStack() as stack:
        procs = [
            SinkProcess(
                topic.model_copy(update={"consumer_name": f"sink-{chr(ord('a') + n)}"}),
                root,
                work / "logs" / tag / str(n),
                group=f"sinks-{tag}",
            )
            for n in range(sinks)
        ]
        for proc in procs:
            proc.process.start()
        for proc in procs:
            stack.callback(proc.process.stop, 30)
        for proc in procs:
            proc.process.wait_ready(120)
        # The backlog arrives once the group has settled: every member owns partitions.
        group = f"sinks-{tag}"
        assert wait_until(lambda: owners(topic, group) == sinks, 120, 0.2), "group not stable"
        for proc in procs:
            proc.process.signal(signal.SIGSTOP)
        try:
            for i in range(events):
                producer.append(build_event(i))
            assert producer.flush(300), "backlog not delivered"
        finally:
            for proc in procs:
                proc.process.signal(signal.SIGCONT)
        cpu0, t0 = sum(p.cpu_s() for p in procs), time.perf_counter()

        def total(metric: scrape.Metric) -> float:
            return sum(p.metric(metric) for p in procs)

        marks: dict[float, float] = {}
        deadline = t0 + 600
        while (now := time.perf_counter()) < deadline:
            read = total(catalogue.DECISIONLOG_EVENTS)
            for share in (0.1, 0.9, 1.0):
                if read >= share * events:
                    marks.setdefault(share, now)
            if 1.0 in marks:
                break
            time.sleep(0.01)
        assert 1.0 in marks, "backlog not read"
        read_s = marks[1.0] - t0
        assert wait_until(lambda: total(catalogue.DECISIONLOG_EVENTS_WRITTEN) >= events, 600, 0.05)
        cpu = sum(p.cpu_s() for p in procs) - cpu0
    producer.close()
    counts = written(root)
    assert len(counts) == events, f"{len(counts)} of {events} events in the log"
    return Run(
        round=round_,
        sinks=sinks,
        events=events,
        read_s=round(read_s, 3),
        events_per_s=round(0.8 * events / (marks[0.9] - marks[0.1]), 1),
        cpu_us_per_event=round(cpu / events * 1e6, 1),
        duplicates=sum(n - 1 for n in counts.values()),
        load_average=round(os.getloadavg()[0], 2),
    )


def summary(runs: list[Run], counts: list[int]) -> dict[str, object]:
    """Per count: the median rate and CPU; per round: the rate of each count over one sink's."""
    by_count = {
        n: {
            "events_per_s": statistics.median(r.events_per_s for r in runs if r.sinks == n),
            "cpu_us_per_event": statistics.median(r.cpu_us_per_event for r in runs if r.sinks == n),
        }
        for n in counts
    }
    rounds = sorted({r.round for r in runs})
    ratios = {
        n: [
            round(
                next(r.events_per_s for r in runs if r.round == k and r.sinks == n)
                / next(r.events_per_s for r in runs if r.round == k and r.sinks == counts[0]),
                2,
            )
            for k in rounds
        ]
        for n in counts[1:]
    }
    medians = {n: statistics.median(values) for n, values in ratios.items()}
    return {"by_count": by_count, "ratios": ratios, "median_ratio": medians}


def markdown(runs: list[Run], counts: list[int], totals: dict[str, object]) -> str:
    """The runs and the summary as Markdown."""
    by_count: dict[int, dict[str, float]] = totals["by_count"]  # type: ignore[assignment]
    ratios: dict[int, list[float]] = totals["ratios"]  # type: ignore[assignment]
    medians: dict[int, float] = totals["median_ratio"]  # type: ignore[assignment]
    lines = [
        "# Decision sinks in one consumer group: one against more",
        "",
        f"A Kafka topic of 6 partitions, a backlog of {runs[0].events:,} decision events put on "
        "it while the sinks were stopped, then every sink resumed; events read per second from "
        "a tenth of the backlog read to nine tenths, the sinks' CPU per event until all were "
        "durable. Counts alternating within each round.",
        "",
        "| sinks | events/s (median) | CPU µs/event (median) | events/s over one sink's, per round |",
        "|---:|---:|---:|---|",
    ]
    for n in counts:
        per_round = ", ".join(f"{x:.2f}" for x in ratios.get(n, []))
        median = f" (median **{medians[n]:.2f}×**)" if n in medians else ""
        lines.append(
            f"| {n} | {by_count[n]['events_per_s']:,.0f} | {by_count[n]['cpu_us_per_event']:.1f} "
            f"| {per_round or '–'}{median} |"
        )
    lines += [
        "",
        "| round | sinks | all read after s | events/s | CPU µs/event | written twice | load average |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.round} | {r.sinks} | {r.read_s:.2f} | {r.events_per_s:,.0f} "
            f"| {r.cpu_us_per_event:.1f} | {r.duplicates} | {r.load_average:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Runs the rounds and writes the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=150_000, help="events of the backlog")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sinks", default="1,2", help="sink counts, the first the baseline")
    parser.add_argument("--out", type=Path, default=RESULTS / STEM)
    args = parser.parse_args()
    counts = [int(n) for n in args.sinks.split(",")]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="sinks-bench-") as tmp:
        work = Path(tmp)
        with backend_settings("kafka", work) as base:
            for k in range(1, args.rounds + 1):
                order = counts if k % 2 else list(reversed(counts))
                for n in order:
                    run = measure(base, work, n, args.events, k)
                    print(json.dumps(asdict(run)), flush=True)
                    runs.append(run)
    totals = summary(runs, counts)
    text = markdown(runs, counts, totals)
    data = {"events": args.events, "counts": counts, "runs": [asdict(r) for r in runs], **totals}
    paths = provenance.write(args.out, data, text, provenance.record())
    print(text)
    print("wrote", *paths)


if __name__ == "__main__":
    main()
