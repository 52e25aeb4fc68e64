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

    python -m loadtest.freshness_bench [--stores sqlite,redis] [--rates 200,400] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from fraud.v1 import features_pb2, features_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, ghz
from loadtest.priority import normal_priority
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port

_HISTOGRAM = "fraudmesh_updater_event_to_store_seconds"


def _buckets(url: str) -> dict[float, float]:
    """Cumulative bucket counts of the event-to-store histogram (upper bound → count)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{_HISTOGRAM}_bucket":
                out[float(sample.labels["le"])] = sample.value
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile (seconds) of what a cumulative histogram gained, linear inside a bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


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


def _start_mesh(var_dir: Path, store: str, logs: Path) -> Mesh:
    config = MeshConfig.on_free_ports(
        var_dir=var_dir,
        store=store,
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


def run(var_dir: Path, stores: Sequence[str], rates: Sequence[int], seconds: float,
        probe_interval_s: float) -> list[str]:  # fmt: skip
    """Runs every store and rate; returns the Markdown table rows."""
    rows = []
    population = data.sample_population(var_dir / "data", 2000)
    merchant = population[0].merchant_id
    for store in stores:
        with tempfile.TemporaryDirectory(prefix=f"freshness-{store}-") as tmp:
            work = _fresh_state(var_dir, Path(tmp))
            mesh = _start_mesh(work, store, work / "logs")
            try:
                c = mesh.config
                url = f"http://{c.host}:{c.metrics_ports['updater']}/metrics"
                file = data.write_data_file(
                    work / "score.json", data.score_requests(population, "template")
                )
                ghz.run_ghz(ghz.SCORE, c.envoy_target, file, rps=rates[0], duration_s=3.0,
                            timeout_ms=42)  # fmt: skip
                for rps in rates:
                    before = _buckets(url)
                    probe = Probe(c.envoy_target, f"{c.host}:{c.features_port}", merchant,
                                  probe_interval_s)  # fmt: skip
                    probe.start()
                    result = ghz.run_ghz(ghz.SCORE, c.envoy_target, file, rps=rps,
                                         duration_s=seconds, timeout_ms=42)  # fmt: skip
                    probe.stop()
                    after = _buckets(url)
                    events = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
                    p50, p99 = (histogram_quantile(before, after, q) * 1000 for q in (0.5, 0.99))
                    within = (after.get(0.05, 0) - before.get(0.05, 0)) / events if events else 0
                    s = sorted(probe.samples)
                    probe_p50 = statistics.median(s) * 1000 if s else float("nan")
                    probe_p99 = ghz.percentile(s, 99) * 1000 if s else float("nan")
                    line = (
                        f"| {store} | {rps} | {result.achieved_rps:.0f} | {result.p99_ms:.2f} | "
                        f"{events:.0f} | {p50:.1f} | {p99:.1f} | {within:.2%} | {len(s)} | "
                        f"{probe_p50:.1f} | {probe_p99:.1f} | {probe.timeouts} |"
                    )
                    print(line, flush=True)
                    rows.append(line)
            finally:
                mesh.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the benchmark and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--stores", default="sqlite,redis")
    parser.add_argument("--rates", default="200,400")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--probe-interval-ms", type=float, default=100.0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    header = (
        "| store | offered rps | achieved | Score p99 ms | events | event→store p50 ms | "
        "event→store p99 ms | ≤ 50 ms | probes | answer→visible p50 ms | p99 ms | lost |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    print(header, flush=True)
    rows = run(
        args.var_dir,
        [s for s in args.stores.split(",") if s],
        [int(r) for r in args.rates.split(",")],
        args.seconds,
        args.probe_interval_ms / 1000,
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{header}\n" + "\n".join(rows) + f"\n\nload average {load} at the end")


if __name__ == "__main__":
    main()
