"""The fault matrix: faults injected into real processes while ghz drives open-loop load.

Each row runs ghz (``--async --count-errors``, constant rate, bounded duration) through
Envoy and, meanwhile, breaks something: kills the scorer, slows it, kills the feature
service, stops redis-server, offers three times the edge's rate limit, or restarts every
service with SIGTERM one after the other. The row then reports the share of calls answered
OK with a decision, the p99 latency (all calls, errors included), how the gateway's
circuit breakers moved (from its Prometheus metrics) and how long recovery took.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pandas as pd
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client.parser import text_string_to_metric_families

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services.features import simulate
from services.features import store as feature_store
from services.features.settings import FeaturesSettings
from services.mesh import Mesh, MeshConfig, free_port

REPO = Path(__file__).resolve().parents[1]
PROTO = "fraud/v1/scoring.proto"
BUDGET_MS = 42.0


def ghz_binary() -> str:
    """The ghz executable on PATH or in the Go bin folder (installed by scripts/tools.sh)."""
    found = shutil.which("ghz") or shutil.which("ghz", path=str(Path.home() / "go" / "bin"))
    if found is None:
        raise FileNotFoundError("ghz is not installed: run `make tools`")
    return found


def score_requests(data_dir: Path, count: int = 400, seed: int = 1) -> list[dict[str, object]]:
    """ghz call data for Score: known cards at their merchants, 10% unknown cards.

    Timestamps and ids are ghz template actions, filled per call, so every call is "now".
    """
    tx = pd.read_parquet(
        data_dir / simulate.TRANSACTIONS_FILE,
        columns=["card_id", "merchant_id", "amount_minor", "currency", "channel"],
    )
    rows = tx.tail(20_000).sample(n=count, random_state=seed)
    rng = random.Random(seed)
    requests = []
    for row in rows.itertuples(index=False):
        unknown = rng.random() < 0.1
        requests.append(
            {
                "transaction_id": "load-{{.RequestNumber}}",
                "card_id": f"card-unknown-{rng.randrange(10**6)}" if unknown else row.card_id,
                "merchant_id": row.merchant_id,
                "amount_minor": int(row.amount_minor),
                "currency": row.currency,
                "timestamp": "{{.Timestamp}}",
                "channel": "CHANNEL_CARD_NOT_PRESENT"
                if row.channel == simulate.CARD_NOT_PRESENT
                else "CHANNEL_CARD_PRESENT",
            }
        )
    return requests


@dataclass
class LoadResult:
    """What one ghz run measured."""

    total: int
    ok: int
    statuses: Counter[str]
    p50_ms: float
    p99_ms: float
    ok_p99_ms: float
    rejected_p99_ms: float
    achieved_rps: float
    errors: Counter[str] = field(default_factory=Counter)
    """Error messages by count, for the report's notes."""

    @property
    def ok_share(self) -> float:
        """Share of calls answered OK."""
        return self.ok / self.total if self.total else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


_GHZ_SHUTDOWN = (
    "context canceled",
    "client connection is closing",
    "use of closed network connection",
)


def _ghz_cancelled(error: str) -> bool:
    return any(mark in error for mark in _GHZ_SHUTDOWN)


def run_load(
    target: str, data_file: Path, rps: int, duration_s: float, timeout_ms: int = 200
) -> LoadResult:
    """Runs ghz open loop against ``target`` and summarises every call it made."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        report_path = Path(out.name)
    argv = [
        ghz_binary(),
        "--insecure",
        "--proto", str(REPO / "protos" / PROTO),
        "--import-paths", str(REPO / "protos"),
        "--call", "fraud.v1.FraudScoring/Score",
        "--data-file", str(data_file),
        "--async",
        "--count-errors",
        "--rps", str(rps),
        "--duration", f"{duration_s}s",
        "--concurrency", "50",
        "--connections", "4",
        "--timeout", f"{timeout_ms}ms",
        "--format", "json",
        "--output", str(report_path),
        target,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)
    try:
        if done.returncode != 0 and not report_path.stat().st_size:
            raise RuntimeError(f"ghz failed ({done.returncode}): {done.stderr.strip()}")
        report = json.loads(report_path.read_text())
    finally:
        report_path.unlink(missing_ok=True)
    # ghz cancels the calls still in flight when the duration ends and records them as
    # client-side errors; they say nothing about the mesh, so they are left out.
    details = [d for d in report.get("details") or [] if not _ghz_cancelled(d.get("error", ""))]
    statuses: Counter[str] = Counter(d.get("status", "OK") or "OK" for d in details)
    errors = Counter(f"{d.get('status')}: {d.get('error')}" for d in details if d.get("error"))
    latencies = [d["latency"] / 1e6 for d in details]
    ok = [d["latency"] / 1e6 for d in details if (d.get("status") or "OK") == "OK"]
    rejected = [d["latency"] / 1e6 for d in details if d.get("status") == "ResourceExhausted"]
    return LoadResult(
        errors=errors,
        total=len(details),
        ok=len(ok),
        statuses=statuses,
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
        ok_p99_ms=_percentile(ok, 0.99),
        rejected_p99_ms=_percentile(rejected, 0.99),
        achieved_rps=float(report.get("rps", 0.0)),
    )


def gateway_counters(metrics_url: str) -> dict[str, float]:
    """Flattened counters of the gateway's /metrics: ``name{label=value,…}`` → value."""
    with urllib.request.urlopen(metrics_url, timeout=2) as reply:
        text = reply.read().decode()
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_total") or sample.name == "fraudmesh_breaker_state":
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                flat[f"{sample.name}{{{labels}}}"] = sample.value
    return flat


def _score_once(target: str, card_id: str, merchant_id: str) -> pb.ScoreResponse | None:
    ts = Timestamp()
    ts.FromNanoseconds(time.time_ns())
    request = pb.ScoreRequest(
        transaction_id=f"probe-{time.time_ns()}",
        card_id=card_id,
        merchant_id=merchant_id,
        amount_minor=1500,
        currency="EUR",
        timestamp=ts,
    )
    try:
        with grpc.insecure_channel(target) as channel:
            return pb_grpc.FraudScoringStub(channel).Score(request, timeout=0.5)
    except grpc.RpcError:
        return None


@dataclass
class Row:
    """One line of the fault matrix."""

    fault: str
    expected: str
    load: LoadResult | None = None
    breaker: str = ""
    notes: list[str] = field(default_factory=list)

    def passed(self) -> bool:
        """Whether the row meets its expectation."""
        load = self.load
        if load is None or load.total == 0:
            return False
        if self.fault.startswith("3x"):
            only_shed = set(load.statuses) <= {"OK", "ResourceExhausted"}
            return only_shed and load.ok_p99_ms <= BUDGET_MS and load.ok > 0
        return load.ok == load.total and load.p99_ms <= BUDGET_MS


@dataclass(frozen=True)
class ChaosPlan:
    """Rate, duration and timing of one matrix run."""

    rps: int = 200
    duration_s: float = 10.0
    fault_at_s: float = 2.0
    recover_at_s: float = 5.0
    overload_capacity_rps: int = 300
    """Edge rate limit during the overload row; ghz then offers three times this."""


class Chaos:
    """Runs the fault matrix on meshes it starts itself on free ports."""

    def __init__(self, var_dir: Path, log_dir: Path, plan: ChaosPlan) -> None:
        self.var_dir = var_dir
        self.log_dir = log_dir
        self.plan = plan
        data_dir = FeaturesSettings(var_dir=var_dir).data_path
        self.data_file = log_dir / "score-requests.json"
        log_dir.mkdir(parents=True, exist_ok=True)
        requests = score_requests(data_dir)
        self.data_file.write_text(json.dumps(requests))
        known = next(r for r in requests if not str(r["card_id"]).startswith("card-unknown"))
        self.probe_card = str(known["card_id"])
        self.probe_merchant = str(known["merchant_id"])

    @contextmanager
    def mesh(self, store: str = "sqlite", **overrides: object) -> Iterator[Mesh]:
        """A fresh mesh for a group of rows, with gateway metrics exposed."""
        replicas = int(overrides.pop("gateway_replicas", 1))  # type: ignore[call-overload]
        config = MeshConfig.on_free_ports(
            gateway_replicas=replicas,
            var_dir=self.var_dir,
            store=store,
            log_dir=self.log_dir / f"mesh-{store}-{free_port()}",
            metrics_ports={"gateway": free_port()},
            **overrides,
        )
        mesh = Mesh(config)

        def ready(name: str) -> None:
            if name == "redis":
                self._materialize_redis(config)

        mesh.start(timeout_s=120, on_ready=ready)
        try:
            yield mesh
        finally:
            mesh.stop()

    def _materialize_redis(self, config: MeshConfig) -> None:
        settings = FeaturesSettings(
            var_dir=self.var_dir,
            store="redis",
            redis_connection=f"{config.host}:{config.redis_port}",
        )
        feature_store.materialize(settings)

    def _run(
        self,
        mesh: Mesh,
        row: Row,
        fault: Callable[[], object] | None = None,
        recover: Callable[[], object] | None = None,
        rps: int | None = None,
        recovered: Callable[[pb.ScoreResponse], bool] | None = None,
    ) -> Row:
        """Drives load for the plan's duration, faulting and recovering on schedule."""
        plan = self.plan
        metrics_url = f"http://127.0.0.1:{mesh.config.metrics_ports['gateway']}/metrics"
        before = gateway_counters(metrics_url)
        result: list[LoadResult] = []
        load = threading.Thread(
            target=lambda: result.append(
                run_load(mesh.config.envoy_target, self.data_file, rps or plan.rps, plan.duration_s)
            )
        )
        start = time.monotonic()
        load.start()
        if fault is not None:
            time.sleep(max(0.0, plan.fault_at_s - (time.monotonic() - start)))
            fault()
        if recover is not None:
            time.sleep(max(0.0, plan.recover_at_s - (time.monotonic() - start)))
            recover()
            if recovered is not None:
                back = time.monotonic()
                while time.monotonic() - back < 10:
                    response = _score_once(
                        mesh.config.envoy_target, self.probe_card, self.probe_merchant
                    )
                    if response is not None and recovered(response):
                        row.notes.append(f"recovered {time.monotonic() - back:.1f} s after restart")
                        break
                    time.sleep(0.1)
                else:
                    row.notes.append("not recovered within 10 s of restart")
        load.join()
        row.load = result[0] if result else None
        row.breaker = _breaker_summary(before, gateway_counters(metrics_url))
        return row

    def run(self, rows: set[str] | None = None) -> list[Row]:
        """Runs the matrix (or the named rows) and returns its rows."""
        wanted = rows or set(ROW_NAMES)
        out: list[Row] = []
        with self.mesh() as mesh:
            if "baseline" in wanted:
                out.append(self._run(mesh, Row("none (baseline)", "100% OK, model, p99 < 42 ms")))
            if "scorer-killed" in wanted:
                scorer = mesh.processes["scorer"]
                out.append(
                    self._run(
                        mesh,
                        Row("scorer killed, then restarted", "100% OK (rules while down)"),
                        fault=lambda: scorer.signal(signal.SIGKILL),
                        recover=lambda: mesh.restart("scorer"),
                        recovered=lambda r: r.scored_by == pb.SCORED_BY_MODEL,
                    )
                )
            if "scorer-slow" in wanted:
                scorer = mesh.processes["scorer"]
                normal = dict(scorer.env)
                scorer.env = {**normal, "FRAUD_SCORER_FAULT_DELAY_MS": "100"}
                mesh.restart("scorer")
                out.append(
                    self._run(mesh, Row("scorer slowed by 100 ms", "100% OK, breaker opens, rules"))
                )
                scorer.env = normal
                mesh.restart("scorer")
            if "features-killed" in wanted:
                features = mesh.processes["features"]
                out.append(
                    self._run(
                        mesh,
                        Row("features service killed, then restarted", "100% OK, defaults"),
                        fault=lambda: features.signal(signal.SIGKILL),
                        recover=lambda: mesh.restart("features"),
                        recovered=lambda r: r.feature_source == pb.FEATURE_SOURCE_ONLINE,
                    )
                )
        if "redis-stopped" in wanted:
            with self.mesh(store="redis") as mesh:

                def redis_back() -> None:
                    # The restarted server is empty (no persistence): refill it.
                    mesh.restart("redis")
                    self._materialize_redis(mesh.config)

                out.append(
                    self._run(
                        mesh,
                        Row("redis-server stopped, then restarted", "100% OK, defaults"),
                        fault=lambda: mesh.processes["redis"].stop(),
                        recover=redis_back,
                        recovered=lambda r: r.feature_source == pb.FEATURE_SOURCE_ONLINE,
                    )
                )
        if "overload" in wanted:
            capacity = self.plan.overload_capacity_rps
            with self.mesh(rate_limit_rps=capacity) as mesh:
                out.append(
                    self._run(
                        mesh,
                        Row(
                            f"3x the edge limit ({3 * capacity} rps offered, limit {capacity})",
                            "accepted p99 < 42 ms, rest RESOURCE_EXHAUSTED fast",
                        ),
                        rps=3 * capacity,
                    )
                )
        if "rolling-restart" in wanted:
            with self.mesh(gateway_replicas=2) as mesh:
                out.append(self._rolling(mesh))
        return out

    def _rolling(self, mesh: Mesh) -> Row:
        """SIGTERM and restart every service in turn while load runs."""
        row = Row("SIGTERM rolling restart of each service", "0 failed requests")
        order = ["gateway", "gateway-2", "features", "scorer"]

        def restart_all() -> None:
            for name in order:
                mesh.restart(name)
                row.notes.append(f"{name} restarted")

        plan = self.plan
        longer = ChaosPlan(
            rps=plan.rps,
            duration_s=max(plan.duration_s, 25.0),
            fault_at_s=1.0,
            recover_at_s=1.0,
            overload_capacity_rps=plan.overload_capacity_rps,
        )
        saved, self.plan = self.plan, longer
        try:
            return self._run(mesh, row, fault=restart_all)
        finally:
            self.plan = saved


ROW_NAMES = (
    "baseline",
    "scorer-killed",
    "scorer-slow",
    "features-killed",
    "redis-stopped",
    "overload",
    "rolling-restart",
)


def _breaker_summary(before: dict[str, float], after: dict[str, float]) -> str:
    """Breaker transitions, fallback answers and sheds during a row, from metric deltas."""

    def delta(prefix: str) -> dict[str, float]:
        return {
            key[len(prefix) :]: after[key] - before.get(key, 0.0)
            for key in after
            if key.startswith(prefix) and after[key] - before.get(key, 0.0) > 0
        }

    parts = []
    for key, count in sorted(delta("fraudmesh_breaker_transitions_total{").items()):
        labels = dict(kv.split("=") for kv in key.rstrip("}").split(","))
        parts.append(f"{labels['dependency']}→{labels['to']}×{count:.0f}")
    answers = delta("fraudmesh_decisions_total{")
    total = sum(answers.values()) or 1.0
    rules = sum(v for k, v in answers.items() if "scored_by=rules" in k)
    defaults = sum(v for k, v in answers.items() if "feature_source=default" in k)
    parts.append(f"rules {rules / total:.0%}, default features {defaults / total:.0%}")
    return "; ".join(parts)


def markdown(rows: list[Row], plan: ChaosPlan) -> str:
    """The matrix as a Markdown table."""
    lines = [
        f"Open-loop load through Envoy: {plan.rps} rps for {plan.duration_s:.0f} s per row "
        f"(fault at {plan.fault_at_s:.0f} s, recovery at {plan.recover_at_s:.0f} s), "
        f"ghz --async --count-errors; latencies over all calls, errors included.",
        "",
        "| fault | expected | calls | OK | p50 ms | p99 ms | OK p99 ms | other statuses "
        "| breakers and fallbacks | notes | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        load = row.load
        if load is None:
            lines.append(f"| {row.fault} | {row.expected} | no result | | | | | | | | FAIL |")
            continue
        others = ", ".join(f"{k} {v}" for k, v in sorted(load.statuses.items()) if k != "OK")
        if "ResourceExhausted" in load.statuses:
            others += f" (p99 {load.rejected_p99_ms:.1f} ms)"
        lines.append(
            f"| {row.fault} | {row.expected} | {load.total} | {load.ok_share:.2%} "
            f"| {load.p50_ms:.1f} | {load.p99_ms:.1f} | {load.ok_p99_ms:.1f} | {others or '-'} "
            f"| {row.breaker} | {'; '.join(row.notes) or '-'} "
            f"| {'PASS' if row.passed() else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"
