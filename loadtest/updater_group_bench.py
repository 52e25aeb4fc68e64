"""How the live updater scales as a partitioned group: one member against two (or more).

    python -m loadtest.updater_group_bench [--events 40000] [--rounds 3] [--members 1,2]

A Kafka broker and a redis-server (the online store) are started here on free ports (``make
test-brokers``). Each measurement gets a fresh 6-partition topic, a fresh group and state
folder on a copy of ``var``'s dataset (``make data``). The members (``python -m
services.updater`` with ``FRAUD_UPDATER_PARTITIONED=true``, consumer names ``updater-a``,
``updater-b``, …) start on the empty topic, seed, and are stopped (SIGSTOP) once every member
owns partitions of all three topics; ``--events`` decision events of the dataset's cards, merchants
and terminals (new transactions, one outcome per 20 decisions) go onto the log meanwhile;
then every member is resumed at once. Measured: events applied per second (decisions and
outcomes, each counted once although a group consumes it from three topics) from a tenth of the
backlog applied to nine tenths, the time until all were applied, and the CPU per event of the
members, of the broker and of redis-server over that time. The sessions last 60 s, so that
the pause does not end them. One unrecorded run of each count (a third of the backlog)
warms the broker up first. The counts alternate within each round (1, 2, then 2, 1, …),
and the ratio is each round's. Results: ``loadtest/results/updater-group.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import psutil
from prometheus_client import CollectorRegistry

from fraud.v1 import events_pb2, outcomes_pb2
from loadtest import provenance
from loadtest.brokers import KafkaBroker, RedisServer, wait_until
from loadtest.runner import check_state
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.common.settings import to_env
from services.domain import featurespec
from services.eventlog import EventLogMetrics, EventLogSettings, open_producer
from services.eventlog.events import new_event_id
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Process, free_port, grpc_serving
from services.updater.partitions import Kind
from services.updater.settings import UpdaterSettings

RESULTS = Path(__file__).with_name("results")
STEM = "updater-group"
PARTITIONS = 6
OUTCOME_EVERY = 20
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    """One measurement: ``members`` members catching up with ``events`` events."""

    round: int
    members: int
    events: int
    applied_s: float
    """From the resume until every event was applied."""
    events_per_s: float
    """Applied per second from a tenth of the backlog applied to nine tenths."""
    members_cpu_us_per_event: float
    broker_cpu_us_per_event: float
    redis_cpu_us_per_event: float
    load_average: float


def build_events(data_dir: Path, n: int) -> list[events_pb2.EventEnvelope]:
    """``n`` events: decisions of the dataset's transactions replayed as new ones (times of
    now, in order), and after every ``OUTCOME_EVERY`` decisions an outcome of one of them."""
    tx = pd.read_parquet(data_dir / layout.TRANSACTIONS_FILE)
    rows = tx.sample(n, replace=len(tx) < n, random_state=7)
    base_ns = time.time_ns()
    out = []
    tag = uuid.uuid4().hex[:8]
    for i, row in enumerate(rows.itertuples(index=False)):
        envelope = events_pb2.EventEnvelope()
        d = envelope.decision
        d.event_id = new_event_id()
        d.transaction_id = f"{tag}-{i}"
        d.card_id = str(row.card_id)
        d.merchant_id = str(row.merchant_id)
        d.amount_minor = int(row.amount_minor)
        d.currency = str(row.currency)
        d.card_not_present = row.channel == featurespec.CARD_NOT_PRESENT
        d.terminal_id = row.terminal_id if isinstance(row.terminal_id, str) else ""
        d.timestamp.FromNanoseconds(base_ns + i * 1_000_000)
        d.decided_at.FromNanoseconds(base_ns + i * 1_000_000)
        out.append(envelope)
        if len(out) >= n:
            break
        if i % OUTCOME_EVERY == OUTCOME_EVERY - 1:
            outcome = events_pb2.EventEnvelope()
            o = outcome.outcome
            o.event_id = new_event_id()
            o.transaction_id = f"{tag}-{i - 7}"
            o.outcome = outcomes_pb2.OUTCOME_FRAUD
            o.reported_at.FromNanoseconds(base_ns + i * 1_000_000)
            o.received_at.FromNanoseconds(base_ns + i * 1_000_000)
            out.append(outcome)
            if len(out) >= n:
                break
    return out


class Member:
    """One ``python -m services.updater`` member, with its /metrics and CPU time."""

    def __init__(
        self, var_dir: Path, log: EventLogSettings, redis_connection: str, group: str, name: str
    ) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        env = {
            **to_env(
                UpdaterSettings,
                port=self.port,
                metrics_port=self.metrics_port,
                var_dir=var_dir,
                group=group,
                partitioned=True,
                list_sweep_s=0,
            ),
            **to_env(
                FeatureStoreSettings,
                var_dir=var_dir,
                store="redis",
                redis_connection=redis_connection,
            ),
            **to_env(
                EventLogSettings,
                var_dir=var_dir,
                backend="kafka",
                kafka_bootstrap=log.kafka_bootstrap,
                kafka_partitions=PARTITIONS,
                kafka_session_timeout_ms=60_000,
                topic=log.topic,
                consumer_name=name,
            ),
        }
        self.process = Process(
            name,
            [sys.executable, "-m", "services.updater"],
            ready=lambda: grpc_serving(f"127.0.0.1:{self.port}"),
            env=env,
            log_path=var_dir / "logs" / f"{group}-{name}.log",
        )

    def cpu_s(self) -> float:
        assert self.process.pid is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def metric(self, metric: scrape.Metric, **labels: str) -> float:
        return scrape.fetch(scrape.url("127.0.0.1", self.metrics_port)).sum(metric, **labels)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(
    var_dir: Path,
    log: EventLogSettings,
    redis: RedisServer,
    servers: tuple[psutil.Process, psutil.Process],
    backlog: list[events_pb2.EventEnvelope],
    members: int,
    round_: int,
) -> Run:
    """``members`` members of a fresh group on a fresh topic catch up with ``backlog``."""
    tag = uuid.uuid4().hex[:8]
    topic = log.model_copy(update={"topic": f"updaters-{tag}"})
    group = f"updaters-{tag}"
    producer = open_producer(topic, EventLogMetrics(CollectorRegistry()))
    events = len(backlog)
    with ExitStack() as stack:
        procs = [
            Member(
                var_dir, topic, f"{redis.host}:{redis.port}", group, f"updater-{chr(ord('a') + n)}"
            )
            for n in range(members)
        ]
        for proc in procs:
            proc.process.start()
            stack.callback(proc.process.stop, 60)
        for proc in procs:
            proc.process.wait_ready(300)

        def settled() -> bool:
            owned = [
                [p.metric(catalogue.UPDATER_PARTITIONS, kind=k.value) for k in Kind] for p in procs
            ]
            return all(min(o) > 0 for o in owned) and all(
                sum(o[i] for o in owned) == PARTITIONS for i in range(len(Kind))
            )

        assert wait_until(settled, 120, 0.2), "the group did not settle"
        for proc in procs:
            proc.process.signal(signal.SIGSTOP)
        try:
            for envelope in backlog:
                producer.append(envelope)
            assert producer.flush(300), "backlog not delivered"
        finally:
            for proc in procs:
                proc.process.signal(signal.SIGCONT)
        t0 = time.perf_counter()
        cpu0 = [sum(p.cpu_s() for p in procs), *(_cpu(s) for s in servers)]

        def applied() -> float:
            # A group consumes each event three times: from the log, then forwarded to the
            # merchant- and transaction-keyed topics (a decision's index entry to the latter,
            # an outcome to both in turn).
            return sum(p.metric(catalogue.UPDATER_RECORDS) for p in procs) / 3

        marks: dict[float, float] = {}
        deadline = t0 + 900
        while (now := time.perf_counter()) < deadline:
            done = applied()
            for share in (0.1, 0.9, 1.0):
                if done >= share * events:
                    marks.setdefault(share, now)
            if 1.0 in marks:
                break
            time.sleep(0.02)
        assert 1.0 in marks, "backlog not applied"
        cpu = [sum(p.cpu_s() for p in procs), *(_cpu(s) for s in servers)]
    producer.close()
    per_event = [(b - a) / events * 1e6 for a, b in zip(cpu0, cpu, strict=True)]
    return Run(
        round=round_,
        members=members,
        events=events,
        applied_s=round(marks[1.0] - t0, 3),
        events_per_s=round(0.8 * events / (marks[0.9] - marks[0.1]), 1),
        members_cpu_us_per_event=round(per_event[0], 1),
        broker_cpu_us_per_event=round(per_event[1], 1),
        redis_cpu_us_per_event=round(per_event[2], 1),
        load_average=round(os.getloadavg()[0], 2),
    )


def summary(runs: list[Run], counts: list[int]) -> dict[str, object]:
    """Per count: medians; per round: the rate of each count over the first count's."""
    fields = ("events_per_s", "members_cpu_us_per_event", "broker_cpu_us_per_event",
              "redis_cpu_us_per_event")  # fmt: skip
    by_count = {
        n: {f: statistics.median(getattr(r, f) for r in runs if r.members == n) for f in fields}
        for n in counts
    }
    rounds = sorted({r.round for r in runs})

    def rate(k: int, n: int) -> float:
        return next(r.events_per_s for r in runs if r.round == k and r.members == n)

    ratios = {n: [round(rate(k, n) / rate(k, counts[0]), 2) for k in rounds] for n in counts[1:]}
    medians = {n: statistics.median(values) for n, values in ratios.items()}
    return {"by_count": by_count, "ratios": ratios, "median_ratio": medians}


def markdown(runs: list[Run], counts: list[int], totals: dict[str, object]) -> str:
    """The runs and the summary as Markdown."""
    by_count: dict[int, dict[str, float]] = totals["by_count"]  # type: ignore[assignment]
    ratios: dict[int, list[float]] = totals["ratios"]  # type: ignore[assignment]
    medians: dict[int, float] = totals["median_ratio"]  # type: ignore[assignment]
    lines = [
        "# The live updater as a partitioned group: one member against more",
        "",
        f"A Kafka topic of 6 partitions (and the merchant- and transaction-keyed topics it forwards to), a backlog of "
        f"{runs[0].events:,} events (decisions of the dataset's entities, one outcome per "
        f"{OUTCOME_EVERY}) put on it while the members were stopped, then every member "
        "resumed; events applied per second from a tenth of the backlog to nine tenths, CPU per "
        "event until all were applied. Online store: redis-server. Counts alternating within "
        "each round.",
        "",
        "| members | events/s (median) | members' CPU µs/event | broker's | redis's "
        "| events/s over one member's, per round |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for n in counts:
        c = by_count[n]
        per_round = ", ".join(f"{x:.2f}" for x in ratios.get(n, []))
        median = f" (median **{medians[n]:.2f}×**)" if n in medians else ""
        lines.append(
            f"| {n} | {c['events_per_s']:,.0f} | {c['members_cpu_us_per_event']:.0f} "
            f"| {c['broker_cpu_us_per_event']:.0f} | {c['redis_cpu_us_per_event']:.0f} "
            f"| {per_round or '–'}{median} |"
        )
    lines += [
        "",
        "| round | members | all applied after s | events/s | members' CPU µs/event "
        "| broker's | redis's | load average |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.round} | {r.members} | {r.applied_s:.2f} | {r.events_per_s:,.0f} "
            f"| {r.members_cpu_us_per_event:.0f} | {r.broker_cpu_us_per_event:.0f} "
            f"| {r.redis_cpu_us_per_event:.0f} | {r.load_average:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Runs the rounds and writes the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=40_000, help="events of the backlog")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--members", default="1,2", help="member counts, the first the baseline")
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=RESULTS / STEM)
    args = parser.parse_args()
    check_state(args.var_dir)
    counts = [int(n) for n in args.members.split(",")]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="updater-group-") as tmp:
        work = Path(tmp)
        var_dir = work / "var"
        for name in ("data", "feast"):
            shutil.copytree(args.var_dir / name, var_dir / name, symlinks=True)
        backlog = build_events(var_dir / "data", args.events)
        with ExitStack() as stack:
            broker = KafkaBroker(work / "kafka")
            broker.start()
            stack.callback(broker.stop)
            redis = RedisServer(work / "redis")
            redis.start()
            stack.callback(redis.stop)
            assert broker.process is not None and redis.process is not None
            servers = (psutil.Process(broker.process.pid), psutil.Process(redis.process.pid))
            log = EventLogSettings(
                var_dir=var_dir,
                backend="kafka",
                kafka_bootstrap=broker.bootstrap,
                kafka_partitions=PARTITIONS,
                groups=(),
            )
            # One unrecorded run of each count first: the broker's JIT warms up (its CPU per
            # event falls by about half over the first runs), so that no count pays for it.
            for n in counts:
                measure(var_dir, log, redis, servers, backlog[: len(backlog) // 3], n, 0)
            for k in range(1, args.rounds + 1):
                order = counts if k % 2 else list(reversed(counts))
                for n in order:
                    run = measure(var_dir, log, redis, servers, backlog, n, k)
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
