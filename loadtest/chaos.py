"""The fault matrix: faults injected into real processes while ghz drives open-loop load.

Each row runs ghz (``--async --count-errors``, constant rate, bounded duration) through
Envoy and, meanwhile, breaks something: kills the scorer, slows it, kills the feature
service, stops redis-server, offers three times the edge's rate limit, or restarts every
service with SIGTERM one after the other. The row then reports the share of calls answered
OK with a decision, the p99 latency (all calls, errors included), how the gateway's
circuit breakers moved (from its Prometheus metrics) and how long recovery took.

A row passes when the fault cost no more late (DEADLINE_EXCEEDED or over the 42 ms budget)
or failed calls than the same run's baseline, within a small slack (``loadtest.faultwindow``):
calls that ended from the fault on are judged against the calls of the same row that ended
before it, or, for a fault that lasts the whole row (a slow scorer, overload), against the
baseline row of the same run.
"""

from __future__ import annotations

import math
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, faultwindow, ghz
from loadtest.drive import VERSION_ANSWERS
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port

REPO = Path(__file__).resolve().parents[1]
PROTO = "fraud/v1/scoring.proto"
BUDGET_MS = 42.0


def gateway_counters(metrics_url: str) -> dict[str, float]:
    """Flattened counters of the gateway's /metrics: ``name{label=value,…}`` → value."""
    flat: dict[str, float] = {}
    for sample in scrape.fetch(metrics_url, timeout_s=2).samples:
        if sample.name.endswith("_total") or sample.name == catalogue.BREAKER_STATE.name:
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


SHED = "ResourceExhausted"
"""The status of a call shed by a rate limit or the gateway's in-flight limit."""
WARMUP_S = 0.5
"""The first half second of a row's load, left out of its judgement (ghz connecting)."""


@dataclass
class Row:
    """One line of the fault matrix."""

    fault: str
    expected: str
    load: ghz.Result | None = None
    breaker: str = ""
    notes: list[str] = field(default_factory=list)
    fault_s: float | None = None
    """Wall-clock time (epoch seconds) the fault began; None when it lasts the whole row."""
    shed_expected: bool = False
    """Shedding is the expected answer to this fault: shed calls are neither late nor failed."""
    reference: faultwindow.Tally | None = None
    """The baseline row's tally, for a fault that lasts the whole row."""

    def _bad(self, call: ghz.CallRecord) -> bool:
        if self.shed_expected and call.status == SHED:
            return False
        return faultwindow.late_or_failed(call.status == "OK", call.latency_ms, BUDGET_MS)

    def _judged(self) -> list[ghz.CallRecord]:
        calls = list(self.load.calls) if self.load is not None else []
        if calls:
            # ghz's first calls open its connections and are slow for it alone: they are
            # neither baseline nor fault.
            warm = min(c.started_s for c in calls) + WARMUP_S
            calls = [c for c in calls if c.started_s >= warm]
        # Shed calls were refused, not answered: the window counts the answered ones.
        return [c for c in calls if c.status != SHED] if self.shed_expected else calls

    def tallies(self) -> tuple[faultwindow.Tally | None, faultwindow.Tally]:
        """(baseline, fault window): the calls that ended before the fault and from it on.
        A call in flight when the fault began belongs to the fault's window. For a fault
        that lasts the whole row, the baseline is the reference (None if unset)."""
        calls = self._judged()
        if self.fault_s is None:
            return self.reference, faultwindow.tally(calls, self._bad)
        fault_s = self.fault_s
        before = [c for c in calls if c.started_s + c.latency_ms / 1000 < fault_s]
        after = [c for c in calls if c.started_s + c.latency_ms / 1000 >= fault_s]
        return faultwindow.tally(before, self._bad), faultwindow.tally(after, self._bad)

    def whole(self) -> faultwindow.Tally:
        """Every judged call of the row (the reference the whole-row faults are judged by)."""
        return faultwindow.tally(self._judged(), self._bad)

    def verdict(self) -> faultwindow.Verdict | None:
        """The fault window judged against the baseline; None without a baseline."""
        baseline, fault = self.tallies()
        return None if baseline is None else faultwindow.judge(baseline, fault)

    def unexpected_statuses(self) -> set[str]:
        """Statuses no call may end with: anything but OK and DEADLINE_EXCEEDED (a late call,
        judged by the verdict), and RESOURCE_EXHAUSTED where shedding is the answer."""
        expected = {"OK", "DeadlineExceeded"} | ({SHED} if self.shed_expected else set())
        return set(self.load.status_counts) - expected if self.load is not None else set()

    def passed(self) -> bool:
        """Whether the row meets its expectation: no unexpected status, and no more late or
        failed calls in the fault's window than its baseline allows; an overload row must
        shed, its typical shed call at least twice as fast as its typical answer."""
        load = self.load
        verdict = self.verdict()
        if load is None or load.count == 0 or verdict is None or not verdict.ok:
            return False
        if self.unexpected_statuses():
            return False
        if self.shed_expected:
            shed = load.status_counts.get(SHED, 0) > 0
            return shed and 2 * self.median_ms(SHED) < self.median_ms("OK")
        return True

    def median_ms(self, status: str) -> float:
        """The median latency of the row's calls that ended with ``status`` (inf if none):
        what a typical call of that status took, which one stall of the machine cannot move
        as it moves a p99."""
        latencies = (
            [c.latency_ms for c in self.load.calls if c.status == status] if self.load else []
        )
        return statistics.median(latencies) if latencies else math.inf


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
        data_dir = FeatureStoreSettings(var_dir=var_dir).data_path
        population = data.sample_population(data_dir, 400)
        # ghz stamps each call's timestamp itself, so the file stays valid for every row.
        self.data_file = data.write_data_file(
            log_dir / "score-requests.json", data.score_requests(population, "template")
        )
        known = next(t for t in population if t.kind == "known")
        self.probe_card = known.card_id
        self.probe_merchant = known.merchant_id

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
            self._settle(mesh)
            yield mesh
        finally:
            mesh.stop()

    def _settle(self, mesh: Mesh, timeout_s: float = 60.0) -> None:
        """Waits until the mesh answers at full quality (the model on online features) with
        every breaker of its gateway closed: a row's baseline must be neither a mesh still
        warming nor the previous row's recovery."""
        metrics_url = f"http://127.0.0.1:{mesh.config.metrics_ports['gateway']}/metrics"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = _score_once(mesh.config.envoy_target, self.probe_card, self.probe_merchant)
            full = (
                answer is not None
                and answer.scored_by in VERSION_ANSWERS
                and answer.feature_source == pb.FEATURE_SOURCE_ONLINE
            )
            states = [
                value
                for key, value in gateway_counters(metrics_url).items()
                if key.startswith("fraudmesh_breaker_state{")
            ]
            if full and not any(states):
                return
            time.sleep(0.1)
        raise RuntimeError(f"no full-quality answer with closed breakers in {timeout_s:.0f} s")

    def _materialize_redis(self, config: MeshConfig) -> None:
        settings = FeatureStoreSettings(
            var_dir=self.var_dir,
            store="redis",
            redis_connection=f"{config.host}:{config.redis_port}",
        )
        store_admin.materialize(settings)

    def _run(
        self,
        mesh: Mesh,
        row: Row,
        fault: Callable[[], object] | None = None,
        recover: Callable[[], object] | None = None,
        rps: int | None = None,
        recovered: Callable[[pb.ScoreResponse, Callable[[str], float]], bool] | None = None,
        split: bool = False,
        settle: bool = True,
    ) -> Row:
        """Drives load for the plan's duration, faulting and recovering on schedule. With
        ``split`` and no fault, the fault's moment is marked all the same. With ``settle``,
        the load starts once the mesh is back at full quality. ``recovered`` judges a probe's
        answer, given the count of the gateway's answers since the restart whose labels hold a
        fragment (``scored_by=model``)."""
        plan = self.plan
        if settle:
            self._settle(mesh)
        metrics_url = f"http://127.0.0.1:{mesh.config.metrics_ports['gateway']}/metrics"
        before = gateway_counters(metrics_url)
        result: list[ghz.Result] = []
        load = threading.Thread(
            target=lambda: result.append(
                ghz.run_ghz(
                    ghz.SCORE,
                    mesh.config.envoy_target,
                    self.data_file,
                    rps=rps or plan.rps,
                    duration_s=plan.duration_s,
                    # Long enough that a late answer shows as latency (judged against the
                    # 42 ms budget) rather than as an error.
                    timeout_ms=200,
                )
            )
        )
        start = time.monotonic()
        load.start()
        if fault is not None or split:
            time.sleep(max(0.0, plan.fault_at_s - (time.monotonic() - start)))
            # The baseline row marks the same moment without a fault: it is judged as the
            # others are, which shows what the judgement makes of a machine's noise alone.
            row.fault_s = time.time()
            if fault is not None:
                fault()
        if recover is not None:
            time.sleep(max(0.0, plan.recover_at_s - (time.monotonic() - start)))
            began = time.monotonic()
            recover()
            if recovered is not None:
                back = time.monotonic()
                since = gateway_counters(metrics_url)

                def answers_since(fragment: str) -> float:
                    now = gateway_counters(metrics_url)
                    prefix = f"{catalogue.DECISIONS.name}{{"
                    return sum(
                        value - since.get(key, 0.0)
                        for key, value in now.items()
                        if key.startswith(prefix) and fragment in key
                    )

                while time.monotonic() - back < 10:
                    response = _score_once(
                        mesh.config.envoy_target, self.probe_card, self.probe_merchant
                    )
                    if response is not None and recovered(response, answers_since):
                        row.notes.append(
                            f"recovered {time.monotonic() - back:.1f} s after the restart, "
                            f"which took {back - began:.1f} s"
                        )
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
        reference: faultwindow.Tally | None = None
        if wanted & {"scorer-slow", "overload"}:
            # Their faults last the whole row: the baseline row is what they are judged by.
            wanted = wanted | {"baseline"}
        with self.mesh() as mesh:
            if "baseline" in wanted:
                base = self._run(
                    mesh, Row("none (baseline)", "OK, model; the reference"), split=True
                )
                reference = base.whole()
                out.append(base)
            if "scorer-killed" in wanted:
                scorer = mesh.processes["scorer"]
                out.append(
                    self._run(
                        mesh,
                        Row(
                            "scorer killed, then restarted",
                            "OK on time as before it, the small model while down, not the rules",
                        ),
                        fault=lambda: scorer.signal(signal.SIGKILL),
                        recover=lambda: mesh.restart("scorer"),
                        # With the cascade on, the probe may be a first-stage approval
                        # that never reaches the scorer: the model answering the load's
                        # other payments again is what shows the scorer back.
                        recovered=lambda r, since: (
                            r.scored_by in VERSION_ANSWERS and since("scored_by=model") > 0
                        ),
                    )
                )
            if "scorer-slow" in wanted:
                scorer = mesh.processes["scorer"]
                normal = dict(scorer.env)
                self._settle(mesh)
                scorer.env = {**normal, "FRAUD_SCORER_FAULT_DELAY_MS": "100"}
                mesh.restart("scorer")
                out.append(
                    self._run(
                        mesh,
                        Row(
                            "scorer slowed by 100 ms",
                            "OK on time as the baseline, breaker opens, small model",
                            reference=reference,
                        ),
                        settle=False,
                    )
                )
                scorer.env = normal
                mesh.restart("scorer")
            if "features-killed" in wanted:
                features = mesh.processes["features"]
                out.append(
                    self._run(
                        mesh,
                        Row(
                            "features service killed, then restarted",
                            "OK on time as before it, defaults",
                        ),
                        fault=lambda: features.signal(signal.SIGKILL),
                        recover=lambda: mesh.restart("features"),
                        recovered=lambda r, _: r.feature_source == pb.FEATURE_SOURCE_ONLINE,
                    )
                )
        if wanted & {"redis-stopped", "rolling-restart"}:
            # One mesh for both rows (a mesh start is seconds of a small machine's CPU): the
            # rolling restart's load starts once the redis row's outage is over and the mesh
            # is back at full quality (``_run`` settles first).
            with self.mesh(store="redis", gateway_replicas=2) as mesh:
                if "redis-stopped" in wanted:
                    out.append(self._redis_row(mesh))
                if "rolling-restart" in wanted:
                    out.append(self._rolling(mesh))
        if "overload" in wanted:
            capacity = self.plan.overload_capacity_rps
            with self.mesh(rate_limit_rps=capacity) as mesh:
                out.append(
                    self._run(
                        mesh,
                        Row(
                            f"3x the edge limit ({3 * capacity} rps offered, limit {capacity})",
                            "accepted on time as the baseline, rest RESOURCE_EXHAUSTED fast",
                            shed_expected=True,
                            reference=reference,
                        ),
                        rps=3 * capacity,
                    )
                )
        return out

    def _redis_row(self, mesh: Mesh) -> Row:
        """Stops redis-server under load and starts it again, refilled."""

        def redis_back() -> None:
            # The restarted server is empty (no persistence): refill it.
            mesh.restart("redis")
            self._materialize_redis(mesh.config)

        return self._run(
            mesh,
            Row("redis-server stopped, then restarted", "OK on time as before it, defaults"),
            fault=lambda: mesh.processes["redis"].stop(),
            recover=redis_back,
            recovered=lambda r, _: r.feature_source == pb.FEATURE_SOURCE_ONLINE,
        )

    def _rolling(self, mesh: Mesh) -> Row:
        """SIGTERM and restart every service in turn while load runs."""
        row = Row("SIGTERM rolling restart of each service", "OK on time as before it")
        order = ["gateway", "gateway-2", "features", "scorer"]

        def restart_all() -> None:
            for name in order:
                mesh.restart(name)
                row.notes.append(f"{name} restarted")

        plan = self.plan
        longer = ChaosPlan(
            rps=plan.rps,
            duration_s=max(plan.duration_s, 25.0),
            fault_at_s=plan.fault_at_s,
            recover_at_s=plan.fault_at_s,
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
    for key, count in sorted(delta(f"{catalogue.BREAKER_TRANSITIONS.name}{{").items()):
        labels = dict(kv.split("=") for kv in key.rstrip("}").split(","))
        parts.append(f"{labels['dependency']}→{labels['to']}×{count:.0f}")
    answers = delta(f"{catalogue.DECISIONS.name}{{")
    total = sum(answers.values()) or 1.0
    rules = sum(v for k, v in answers.items() if "scored_by=rules" in k)
    small = sum(v for k, v in answers.items() if "scored_by=small_model" in k)
    defaults = sum(v for k, v in answers.items() if "feature_source=default" in k)
    parts.append(
        f"rules {rules / total:.0%}, small model {small / total:.0%}, "
        f"default features {defaults / total:.0%}"
    )
    return "; ".join(parts)


def markdown(rows: list[Row], plan: ChaosPlan) -> str:
    """The matrix as a Markdown table."""
    lines = [
        f"Open-loop load through Envoy: {plan.rps} rps for {plan.duration_s:.0f} s per row "
        f"(fault at {plan.fault_at_s:.0f} s, recovery at {plan.recover_at_s:.0f} s), "
        f"ghz --async --count-errors; latencies over all calls, errors included.",
        "",
        f"Late or failed: DEADLINE_EXCEEDED, another error, or OK past {BUDGET_MS:.0f} ms; "
        "baseline: the calls that ended before the fault (a whole-row fault: the baseline row); "
        "a fault may cost at most the baseline's share "
        f"+ max({faultwindow.SLACK_CALLS} calls, {faultwindow.SLACK_SHARE:.0%}).",
        "",
        "| fault | expected | calls | OK | p50 ms | p99 ms | OK p99 ms | other statuses "
        "| late or failed: baseline | faulted (allowed) "
        "| breakers and fallbacks | notes | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        load = row.load
        if load is None:
            lines.append(f"| {row.fault} | {row.expected} | no result | | | | | | | | | | FAIL |")
            continue
        verdict = row.verdict()
        judged = (
            f"{verdict.baseline} | {verdict.fault} ({verdict.allowed})"
            if verdict is not None
            else "- | -"
        )
        others = ", ".join(f"{k} {v}" for k, v in sorted(load.status_counts.items()) if k != "OK")
        if "ResourceExhausted" in load.status_p99_ms:
            others += f" (p99 {load.status_p99_ms['ResourceExhausted']:.1f} ms)"
        ok = load.status_counts.get("OK", 0)
        lines.append(
            f"| {row.fault} | {row.expected} | {load.count} | {ok / load.count:.2%} "
            f"| {load.p50_ms:.1f} | {load.p99_ms:.1f} "
            f"| {load.status_p99_ms.get('OK', math.nan):.1f} | {others or '-'} "
            f"| {judged} | {row.breaker} | {'; '.join(row.notes) or '-'} "
            f"| {'PASS' if row.passed() else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"
