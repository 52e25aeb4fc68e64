"""Feature freshness under load: from an answered Score to its rows in the online store.

For each store (SQLite with the file event log, Redis with Redis Streams) a mesh with the
live loop runs on free ports, and ghz drives Score through Envoy open loop at each rate
(unique transaction ids, timestamps at call time). Two measurements per step:

- **event → store**, as the updater reports it: ``fraudmesh_updater_event_to_store_seconds``,
  from the gateway's ``decided_at`` (set when it answered) to the end of the online-store
  write that carried the event, for every event of the step (the histogram's growth over the
  step; percentiles interpolated inside its 5 ms buckets up to 50 ms);
- **answer → visible**, end to end from outside: a probe scores a fresh card through Envoy
  every ``--probe-interval-ms`` and polls the feature service (``GetFeatures``, every
  millisecond) until that card's 1-hour count is 1; the time from the answer to the first
  read that shows it.

Each rate runs ``--repeats`` times, the rates alternating, in one mesh per store; each run
also records the updater's CPU per event, the share of answers with default features and the
machine's load average. Results go to ``loadtest/results/freshness.md`` and ``.json``.

    python -m loadtest.freshness_bench [--stores sqlite,redis] [--rates 200,400] [--seconds 20]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from fraud.v1 import features_pb2, features_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, ghz, provenance
from loadtest.liveloop import requests_file
from loadtest.priority import normal_priority
from loadtest.rss import RssSampler
from loadtest.runner import RESULTS_DIR, machine_line, mesh_answers
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.domain import metrics
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port


def _scrape(url: str) -> tuple[dict[float, float], dict[str, float]]:
    """The event-to-store histogram's cumulative buckets (upper bound → count; one observation
    per event and view it reached), and counters: decision records the updater consumed,
    checkpoints taken and the seconds they took."""
    page = scrape.fetch(url)
    return page.buckets(catalogue.UPDATER_EVENT_TO_STORE), {
        "decisions": page.sum(catalogue.UPDATER_RECORDS, kind="decision"),
        "checkpoints": page.sum(catalogue.UPDATER_CHECKPOINT.count),
        "checkpoint_s": page.sum(catalogue.UPDATER_CHECKPOINT.sum),
    }


@dataclass
class Probe:
    """Scores fresh cards through Envoy and times until the feature service shows them."""

    envoy: str
    features: str
    merchant_id: str
    interval_s: float

    def __post_init__(self) -> None:
        self.samples: list[float] = []
        self.timeouts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with (
            grpc.insecure_channel(self.envoy) as edge,
            grpc.insecure_channel(self.features) as feat,
        ):
            score = pb_grpc.FraudScoringStub(edge).Score
            read = features_pb2_grpc.FeatureServiceStub(feat).GetFeatures
            while not self._stop.wait(self.interval_s):
                card = f"card-probe-{uuid.uuid4().hex[:12]}"
                request = pb.ScoreRequest(
                    transaction_id=f"probe-{uuid.uuid4().hex}",
                    card_id=card,
                    merchant_id=self.merchant_id,
                    amount_minor=2500,
                    currency="EUR",
                )
                request.timestamp.FromNanoseconds(time.time_ns())
                try:
                    score(request, timeout=1.0)
                except grpc.RpcError:
                    continue
                answered = time.perf_counter()
                query = features_pb2.GetFeaturesRequest(card_id=card, merchant_id=self.merchant_id)
                while True:
                    try:
                        reply = read(query, timeout=1.0)
                    except grpc.RpcError:
                        reply = None
                    if reply is not None and any(
                        f.name == "card_txn_count_1h" and f.value >= 1 for f in reply.features
                    ):
                        self.samples.append(time.perf_counter() - answered)
                        break
                    if time.perf_counter() - answered > 5.0:
                        self.timeouts += 1
                        break
                    time.sleep(0.001)


def _start_mesh(var_dir: Path, store: str, logs: Path, in_process: bool = False) -> Mesh:
    config = MeshConfig.on_free_ports(
        var_dir=var_dir,
        store=store,
        gateway_in_process=in_process,
        log_dir=logs,
        metrics_ports={"gateway": free_port(), "updater": free_port()},
    )
    mesh = Mesh(config)

    def ready(name: str) -> None:
        if name == "redis":
            store_admin.materialize(
                FeatureStoreSettings(
                    var_dir=var_dir,
                    store="redis",
                    redis_connection=f"{config.host}:{config.redis_port}",
                )
            )

    mesh.start(timeout_s=180, on_ready=ready)
    normal_priority([p.pid for p in mesh.processes.values() if p.pid is not None])
    return mesh


def _fresh_state(source: Path, target: Path) -> Path:
    """The dataset, registry, online store and models, without any earlier loop state."""
    for name in ("data", "feast", "models"):
        shutil.copytree(source / name, target / name)
    return target


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _load() -> float:
    return os.getloadavg()[0]


def _step(
    mesh: Mesh,
    store: str,
    rps: int,
    run_no: int,
    seconds: float,
    file: Path,
    merchant: str,
    probe_interval_s: float,
) -> dict[str, Any]:
    """One measured run at ``rps``: ghz load, the probe beside it, histogram and CPU deltas."""
    c = mesh.config
    url = scrape.url(c.host, c.metrics_ports["updater"])
    pids = {n: p.pid for n, p in mesh.processes.items() if p.pid is not None}
    cpu = RssSampler(pids)
    answers = mesh_answers(mesh)
    load_before = _load()
    (before, counts_before), cpu_before = _scrape(url), cpu.cpu_seconds()
    answers_before = answers() if answers is not None else {}
    probe = Probe(c.envoy_target, f"{c.host}:{c.features_port}", merchant, probe_interval_s)
    probe.start()
    result = ghz.run_ghz(ghz.SCORE, c.envoy_target, file, rps=rps, duration_s=seconds,
                         timeout_ms=42)  # fmt: skip
    probe.stop()
    (after, counts_after), cpu_after = _scrape(url), cpu.cpu_seconds()
    answers_after = answers() if answers is not None else {}
    load_after = _load()
    events = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    grown_buckets = scrape.increase(before, after)
    grew = {k: v - counts_before.get(k, 0.0) for k, v in counts_after.items()}
    decisions = grew["decisions"]
    used = {n: cpu_after.get(n, 0.0) - cpu_before.get(n, 0.0) for n in cpu_after}
    grown = {k: v - answers_before.get(k, 0.0) for k, v in answers_after.items()}
    answered = sum(v for k, v in grown.items() if k.startswith("scored_by="))
    samples = sorted(probe.samples)
    return {
        "store": store,
        "eventlog": c.eventlog_backend,
        "rps": rps,
        "run": run_no,
        "score": result.to_dict(),
        "decision_events": round(decisions),
        "rows_observed": round(events),
        "event_to_store_p50_ms": scrape.histogram_quantile(0.5, grown_buckets) * 1000,
        "event_to_store_p99_ms": scrape.histogram_quantile(0.99, grown_buckets) * 1000,
        # The slowest event took at most this long (the first bucket holding every event).
        "event_to_store_max_within_s": _finite(
            min(
                (b for b in after if events and after[b] - before.get(b, 0.0) >= events),
                default=float("nan"),
            )
        ),
        "within_50ms": (after.get(0.05, 0) - before.get(0.05, 0)) / events if events else 0.0,
        "probes": len(samples),
        "probe_timeouts": probe.timeouts,
        "answer_to_visible_p50_ms": metrics.percentile(samples, 50) * 1000 if samples else None,
        "answer_to_visible_p99_ms": metrics.percentile(samples, 99) * 1000 if samples else None,
        "updater_cpu_ms_per_event": (
            used.get("updater", 0.0) * 1000 / decisions if decisions else None
        ),
        "updater_cpu_share": used.get("updater", 0.0) / result.duration_s,
        "checkpoints": round(grew["checkpoints"]),
        "checkpoint_mean_ms": (
            grew["checkpoint_s"] * 1000 / grew["checkpoints"] if grew["checkpoints"] else None
        ),
        # The loop polls nothing while it checkpoints: events that arrive then wait.
        "checkpoint_share": grew["checkpoint_s"] / result.duration_s,
        "mesh_cpu_ms_per_call": sum(used.values()) * 1000 / max(result.count, 1),
        "default_features_share": grown.get("feature_source=default", 0.0) / answered
        if answered
        else None,
        "load_average": [round(load_before, 2), round(load_after, 2)],
    }


def run(var_dir: Path, stores: Sequence[str], rates: Sequence[int], seconds: float,
        probe_interval_s: float, repeats: int,
        in_process: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Runs every store and rate ``repeats`` times (rates alternating); returns every run."""
    runs: list[dict[str, Any]] = []
    population = data.sample_population(var_dir / "data", 2000)
    merchant = population[0].merchant_id
    for store in stores:
        with tempfile.TemporaryDirectory(prefix=f"freshness-{store}-") as tmp:
            work = _fresh_state(var_dir, Path(tmp))
            mesh = _start_mesh(work, store, work / "logs", in_process)
            try:
                file = requests_file(work / "warmup.json", population, "w")
                ghz.run_ghz(ghz.SCORE, mesh.config.envoy_target, file, rps=rates[0],
                            duration_s=3.0, timeout_ms=42)  # fmt: skip
                for repeat in range(1, repeats + 1):
                    for rps in rates:
                        file = requests_file(work / "score.json", population, f"r{repeat}-{rps}")
                        cell = _step(mesh, store, rps, repeat, seconds, file, merchant,
                                     probe_interval_s)  # fmt: skip
                        gone = [p.name for p in mesh.dead()]
                        if gone:
                            raise RuntimeError(f"exited during the run: {', '.join(gone)}")
                        print(_row(cell), flush=True)
                        runs.append(cell)
            finally:
                mesh.stop()
    return runs


def _ms(value: float | None) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.1f}"


_HEADER = (
    "| store + log | offered rps | run | Score p99 ms | default features | decision events | "
    "event→store p50 ms | p99 ms | ≤ 50 ms | answer→visible p50 ms | p99 ms | probes (lost) | "
    "updater CPU µs/event | checkpoints: mean ms (share of time) | load avg |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _row(c: dict[str, Any]) -> str:
    share = c["default_features_share"]
    cpu = c["updater_cpu_ms_per_event"]
    return (
        f"| {c['store']} + {c['eventlog']} | {c['rps']} | {c['run']} | {c['score']['p99_ms']:.2f} | "
        f"{'–' if share is None else f'{share:.1%}'} | {c['decision_events']} | "
        f"{_ms(c['event_to_store_p50_ms'])} | {_ms(c['event_to_store_p99_ms'])} | "
        f"{c['within_50ms']:.2%} | {_ms(c['answer_to_visible_p50_ms'])} | "
        f"{_ms(c['answer_to_visible_p99_ms'])} | {c['probes']} ({c['probe_timeouts']}) | "
        f"{'–' if cpu is None else f'{cpu * 1000:.0f}'} | "
        f"{_ms(c['checkpoint_mean_ms'])} ({c['checkpoint_share']:.1%}) | "
        f"{c['load_average'][0]:.1f}–{c['load_average'][1]:.1f} |"
    )


def summary(runs: Sequence[dict[str, Any]], target_ms: float) -> list[dict[str, Any]]:
    """Per store and rate: medians over the runs and the verdict against ``target_ms``."""
    out = []
    for key in dict.fromkeys((r["store"], r["eventlog"], r["rps"]) for r in runs):
        cells = [r for r in runs if (r["store"], r["eventlog"], r["rps"]) == key]
        p99s = [r["event_to_store_p99_ms"] for r in cells]
        median = statistics.median(p99s)
        cpus = [r["updater_cpu_ms_per_event"] for r in cells if r["updater_cpu_ms_per_event"]]
        out.append(
            {
                "store": key[0],
                "eventlog": key[1],
                "rps": key[2],
                "runs": len(cells),
                "event_to_store_p99_ms": p99s,
                "median_event_to_store_p99_ms": median,
                "median_event_to_store_p50_ms": statistics.median(
                    r["event_to_store_p50_ms"] for r in cells
                ),
                "median_within_50ms": statistics.median(r["within_50ms"] for r in cells),
                "median_updater_cpu_us_per_event": statistics.median(cpus) * 1000 if cpus else None,
                "load_average": [
                    min(r["load_average"][0] for r in cells),
                    max(r["load_average"][1] for r in cells),
                ],
                "met": median <= target_ms,
            }
        )
    return out


def markdown(runs: Sequence[dict[str, Any]], command: str, seconds: float,
             target_ms: float, in_process: bool = False) -> str:  # fmt: skip
    """The report: every run, then medians and verdicts per store and rate."""
    lines = [
        "# Feature freshness under load: an answered Score to its rows in the online store",
        "",
        f"`{command}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine_line()}.",
        "",
        "A mesh with the live loop per store ("
        + (
            "the gateway reading the store and running the model in process; "
            if in_process
            else "Envoy → gateway → feature service + scorer, as designed; "
        )
        + "its own copy of the dataset, registry, online "
        "store and model; the feature updater seeded from the dataset's history), ghz open loop "
        f"through Envoy, {seconds:g} s per run, unique transaction ids and timestamps at call "
        "time, 42 ms deadline. *event→store*: the updater's "
        f"`{catalogue.UPDATER_EVENT_TO_STORE.name}` over the run (from the gateway's "
        "`decided_at` to the end of the online-store write, one observation per event and "
        "view: card and merchant; interpolated inside 5 ms buckets up "
        "to 50 ms, coarser beyond). *answer→visible*: a probe scores a fresh card through "
        "Envoy and reads `GetFeatures` every millisecond until the card's 1-hour count is 1 "
        "(lost: not visible within 5 s). *Checkpoints*: the updater's state saves and log "
        "commits during the run; its loop polls nothing meanwhile. Load average: 1-minute, at "
        "the start and the end of the run (the 2-core machine is shared).",
        "",
        _HEADER,
        *(_row(r) for r in runs),
        "",
        f"## Against the target (event→store p99 ≤ {target_ms:g} ms at 400 rps)",
        "",
        "| store + log | offered rps | runs | event→store p99 ms per run | median p99 ms | "
        "median p50 ms | median ≤ 50 ms | updater CPU µs/event | load avg | verdict |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for s in summary(runs, target_ms):
        cpu = s["median_updater_cpu_us_per_event"]
        lines.append(
            f"| {s['store']} + {s['eventlog']} | {s['rps']} | {s['runs']} | "
            f"{', '.join(_ms(v) for v in s['event_to_store_p99_ms'])} | "
            f"{_ms(s['median_event_to_store_p99_ms'])} | {_ms(s['median_event_to_store_p50_ms'])} "
            f"| {s['median_within_50ms']:.1%} | {'–' if cpu is None else f'{cpu:.0f}'} | "
            f"{s['load_average'][0]:.1f}–{s['load_average'][1]:.1f} | "
            f"{'met' if s['met'] else 'missed'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark and writes ``freshness.md`` and ``.json`` to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--stores", default="sqlite,redis")
    parser.add_argument("--rates", default="200,400")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-interval-ms", type=float, default=100.0)
    parser.add_argument("--target-ms", type=float, default=50.0)
    parser.add_argument(
        "--gateway-in-process",
        action="store_true",
        help="The gateway reads the store and runs the model itself (fewer hops, less CPU).",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="freshness", help="Base name of the report files.")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = "python -m loadtest.freshness_bench " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    print(_HEADER, flush=True)
    runs = run(
        args.var_dir,
        [s for s in args.stores.split(",") if s],
        [int(r) for r in args.rates.split(",")],
        args.seconds,
        args.probe_interval_ms / 1000,
        args.repeats,
        args.gateway_in_process,
    )
    report = markdown(runs, command.strip(), args.seconds, args.target_ms, args.gateway_in_process)
    args.out.mkdir(parents=True, exist_ok=True)
    prov = provenance.record(command.strip())
    (args.out / f"{args.name}.md").write_text(provenance.markdown(report, prov))
    (args.out / f"{args.name}.json").write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "command": command.strip(),
                "finished": datetime.now(UTC).isoformat(),
                "machine": machine_line(),
                "seconds": args.seconds,
                "target_ms": args.target_ms,
                "gateway_in_process": args.gateway_in_process,
                "runs": runs,
                "summary": summary(runs, args.target_ms),
            },
            indent=2,
        )
    )
    print(f"\n{report}\nwrote {args.out / (args.name + '.md')}")


if __name__ == "__main__":
    main()
