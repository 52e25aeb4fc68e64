"""The crash matrix: SIGKILL of each process of the mesh in turn under steady load.

The mesh runs as ``fraudmesh up`` runs it by default from four cores (two Envoys sharing the
edge port, two gateways, two feature services, two scorers, the journal on, the live loop on,
a supervisor that restarts what dies), on a fresh copy of the state; the replicas and
``gateway_in_process`` of ``CrashPlan`` give the smaller machines' default (one of each but
the gateways, which run in process). Load comes from the project's Python
client (its retry policy and waitForReady, docs/reliability.md) in a process of its own
(``loadtest.crashload``), at a fixed rate over several connections, so that every Envoy
holds some. Each row lets the load run, SIGKILLs one process, lets the load run
on while the supervisor restarts it, and reports:

* calls failed (any status but OK and DEADLINE_EXCEEDED) and calls late (DEADLINE_EXCEEDED,
  or OK past the 42 ms budget) from the kill on, judged by ``loadtest.faultwindow`` against
  the run's calls while nothing was faulted (the baseline row and every row before its
  kill): a loaded machine is late now and then whatever the mesh does. Failures are not
  timing and must be none, but for an Envoy the calls in flight on it at the kill;
* answered decisions missing from the decision log afterwards (read as ``fraudmesh
  decisions export`` reads it, once the sink has had time to write everything);
* how long until the killed process was ready again, and until every answer was again
  given by the model on stored features (the scorer's and feature service's kills degrade
  answers to the rules or default features meanwhile).

A baseline row kills nothing and is judged the same way, which shows what the judgement
makes of the machine's noise alone.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, faultwindow
from loadtest.drive import VERSION_ANSWERS, score_request
from loadtest.runner import copy_state
from services import client
from services.common.edge_security import EdgeSettings
from services.common.settings import from_mapping, to_env
from services.decisionlog import reader
from services.decisionlog.settings import DecisionLogSettings
from services.featurestore import admin as store_admin
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.mesh import CrashLoop, Mesh, MeshConfig, RestartPolicy, Supervisor

REPO = Path(__file__).resolve().parents[1]
BUDGET_MS = faultwindow.BUDGET_MS
WARMUP_S = 0.5
"""The first half second of a row's load is left out (the connections' first calls)."""
FAILED = "failed"
OK = "OK"
LATE_STATUS = "DEADLINE_EXCEEDED"


@dataclass(frozen=True, slots=True)
class Call:
    """One Score call of the load."""

    sent_s: float
    """Monotonic send time."""
    latency_s: float
    status: str
    """gRPC status name (OK, DEADLINE_EXCEEDED, UNAVAILABLE, …)."""
    transaction_id: str
    degraded: bool = False
    """Answered by the rules or on default features."""

    @property
    def ended_s(self) -> float:
        """Monotonic time the call ended."""
        return self.sent_s + self.latency_s

    @property
    def late(self) -> bool:
        """DEADLINE_EXCEEDED, or answered past the budget."""
        return self.status == LATE_STATUS or (
            self.status == OK and self.latency_s * 1000 > BUDGET_MS
        )

    @property
    def failed(self) -> bool:
        """Ended with a status that is neither an answer nor a missed deadline."""
        return self.status not in (OK, LATE_STATUS)


class Load:
    """Score calls through the edge at a fixed rate over ``connections`` channels of the
    project's Python client (open loop: a slow answer never delays the next call), sent from
    a process of its own (``loadtest.crashload``)."""

    def __init__(
        self,
        target: str,
        population: Sequence[data.Txn],
        rps: float,
        connections: int = 4,
        deadline_s: float = BUDGET_MS / 1000,
        prefix: str = "crash",
        work_dir: Path | None = None,
    ) -> None:
        self.target = target
        self.prefix = prefix
        self.calls: list[Call] = []
        folder = work_dir or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        self._requests = folder / f"{prefix}-requests.json"
        self._requests.write_text(
            json.dumps(
                [
                    [t.card_id, t.merchant_id, t.amount_minor, t.currency, t.card_not_present]
                    for t in population
                ]
            )
        )
        self._argv = [
            sys.executable, "-m", "loadtest.crashload",
            "--target", target, "--requests", str(self._requests), "--rps", str(rps),
            "--connections", str(connections), "--deadline-s", str(deadline_s),
            "--prefix", prefix,
        ]  # fmt: skip
        self._process: subprocess.Popen[str] | None = None
        self._reader = threading.Thread(target=self._read, name="crash-load-reader", daemon=True)
        self._ready = threading.Event()
        self._errors: list[str] = []

    def start(self) -> None:
        """Starts the client process; returns once every connection is up."""
        self._process = subprocess.Popen(
            self._argv,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader.start()
        if not self._ready.wait(60):
            self.stop()
            raise RuntimeError(f"no connection to {self.target} within 60 s")
        if self._errors:
            self.stop()
            raise RuntimeError(f"the load failed: {self._errors[0]}")

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            if kind == "call":
                sent, latency, status, tx_id, degraded = rest.split(" ")
                self.calls.append(Call(float(sent), float(latency), status, tx_id, degraded == "1"))
            elif kind == "ready":
                self._ready.set()
            elif kind == "error":
                self._errors.append(rest)
            elif kind == "end":
                break
        self._ready.set()

    def snapshot(self) -> list[Call]:
        """The calls ended so far."""
        return list(self.calls)

    def stop(self) -> list[Call]:
        """Stops sending, waits for the calls in flight, returns every call."""
        process = self._process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.write("stop\n")
                process.stdin.close()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._reader.join(30)
        self._requests.unlink(missing_ok=True)
        if self._errors:
            raise RuntimeError(f"the load failed: {self._errors[0]}")
        return sorted(self.calls, key=lambda c: c.sent_s)


def _steady(calls: Sequence[Call], seconds: float) -> bool:
    """True when every call of the last ``seconds`` was answered at full quality."""
    if not calls:
        return False
    end = max(c.ended_s for c in calls)
    recent = [c for c in calls if c.ended_s >= end - seconds]
    return all(c.status == OK and not c.degraded for c in recent)


@dataclass
class Row:
    """One process killed under load, and what it cost."""

    process: str | None
    """The process SIGKILLed; None for the baseline row."""
    calls: list[Call] = field(default_factory=list)
    kill_s: float = 0.0
    """Monotonic time of the kill (of the split, for the baseline)."""
    ready_again_s: float | None = None
    """Seconds from the kill until the supervisor had the process ready again."""
    missing: list[str] = field(default_factory=list)
    """Answered transactions the decision log does not hold."""
    reference: faultwindow.Tally | None = None
    """The run's calls while nothing was faulted (``reference``); None: this row's own
    calls before its kill."""
    connections_at_kill: int | None = None
    """For an Envoy: the client connections it held when it was killed (from its admin
    page), so a row whose Envoy held none is seen as proving nothing."""

    @property
    def name(self) -> str:
        """What the row kills."""
        return self.process or "none (baseline)"

    def _judged(self) -> list[Call]:
        if not self.calls:
            return []
        warm = self.calls[0].sent_s + WARMUP_S
        return [c for c in self.calls if c.sent_s >= warm]

    def windows(self) -> tuple[faultwindow.Tally, faultwindow.Tally]:
        """(before, from the kill on): a call still in flight at the kill is the kill's."""
        calls = self._judged()
        before = [c for c in calls if c.ended_s < self.kill_s]
        after = [c for c in calls if c.ended_s >= self.kill_s]
        return (
            faultwindow.Tally(len(before), sum(c.late for c in before)),
            faultwindow.Tally(len(after), sum(c.late for c in after)),
        )

    def failed(self) -> list[Call]:
        """Calls that failed (not answered, not merely late)."""
        return [c for c in self.calls if c.failed]

    def in_flight_at_kill(self) -> int:
        """Calls sent before the kill that had not ended by it."""
        return sum(1 for c in self.calls if c.sent_s < self.kill_s <= c.ended_s)

    def answered(self) -> list[Call]:
        """Calls answered OK (each answer is a decision that must reach the log)."""
        return [c for c in self.calls if c.status == OK]

    def quality_back_s(self) -> float | None:
        """Seconds from the kill until the end of the last degraded or failed answer after
        it (0 when none was); None when the row ended degraded."""
        after = [c for c in self.calls if c.ended_s >= self.kill_s]
        bad = [c for c in after if c.degraded or c.status != OK]
        if not bad:
            return 0.0
        last = max(bad, key=lambda c: c.ended_s)
        if not any(c.sent_s > last.sent_s for c in after):
            return None
        return max(0.0, last.ended_s - self.kill_s)

    @property
    def edge(self) -> bool:
        """True for an Envoy: the calls in flight on its connections may fail."""
        return self.process is not None and self.process.split("-")[0] == "envoy"

    def late_allowed(self) -> int:
        """Late calls the window from the kill on may have."""
        before, after = self.windows()
        return faultwindow.allowed(self.reference or before, after.calls)

    def failures_allowed(self) -> int:
        """Failed calls the kill may cost: the calls in flight at it for an Envoy, else none."""
        return self.in_flight_at_kill() if self.edge else 0

    def problems(self) -> list[str]:
        """Why the row fails (empty when it passes)."""
        out = []
        failed = self.failed()
        if len(failed) > self.failures_allowed():
            out.append(f"{len(failed)} failed, at most {self.failures_allowed()} allowed")
        if any(c.sent_s >= self.kill_s for c in failed):
            out.append("a call sent after the kill failed")
        after = self.windows()[1]
        allowed = self.late_allowed()
        if after.calls == 0:
            out.append("no calls after the kill")
        elif after.bad > allowed:
            # When they were sent tells one stall of the machine (a burst within a few hundred
            # milliseconds) from a process that answers late for seconds.
            sent = [
                c.sent_s - self.kill_s
                for c in self._judged()
                if c.late and c.ended_s >= self.kill_s
            ]
            out.append(
                f"{after} late, at most {allowed} allowed "
                f"(sent {min(sent):.2f} to {max(sent):.2f} s after the kill)"
            )
        if self.missing:
            out.append(f"{len(self.missing)} answered decision(s) missing from the log")
        if self.process is not None and self.ready_again_s is None:
            out.append("not ready again within the row's longest wait")
        if self.quality_back_s() is None:
            out.append("answers still degraded at the end of the row")
        return out

    def passed(self) -> bool:
        """True when the row meets every expectation."""
        return not self.problems()


@dataclass(frozen=True)
class CrashPlan:
    """How the matrix runs: the mesh's shape, the load, and each row's timing."""

    rps: int = 100
    before_s: float = 3.0
    """Load before the kill: the row's baseline."""
    after_s: float = 12.0
    """Load after the kill, while the process is restarted; longer when its restart takes
    longer (then until it is ready again and ``tail_s`` more, within ``max_after_s``)."""
    tail_s: float = 2.0
    max_after_s: float = 90.0
    connections: int = 4
    store: str = "sqlite"
    gateway_replicas: int = 2
    envoy_replicas: int = 2
    features_replicas: int = 2
    scorer_replicas: int = 2
    gateway_in_process: bool = False
    """The gateways read the store and run the model themselves (``--gateway-in-process``)."""
    edge_max_in_flight: int | None = None
    """The edge's admission limit (``fraudmesh up`` sizes one; None: the template's bound)."""
    journal: str = "write"
    """FRAUD_GATEWAY_JOURNAL of the mesh's gateways."""
    log_wait_s: float = 60.0
    """How long to wait at the end for the decision log to hold every answered decision."""

    def mesh_config(self, var_dir: Path, log_dir: Path) -> MeshConfig:
        """The mesh ``fraudmesh up`` would run with these replicas, on free ports."""
        return MeshConfig.on_free_ports(
            gateway_replicas=self.gateway_replicas,
            envoy_replicas=self.envoy_replicas,
            features_replicas=self.features_replicas,
            scorer_replicas=self.scorer_replicas,
            gateway_in_process=self.gateway_in_process,
            var_dir=var_dir,
            store=self.store,
            log_dir=log_dir,
            extra_env=to_env(GatewaySettings, journal=self.journal)
            | to_env(EdgeSettings, max_in_flight=self.edge_max_in_flight),
        )


def reference(rows: Sequence[Row]) -> faultwindow.Tally:
    """The run's calls while nothing was faulted: the baseline row's and every row's before
    its kill. A few seconds of one row are too few to show how often a loaded machine is
    late by itself; the whole run's are the same run's baseline, many times over."""
    calls = late = 0
    for row in rows:
        before, after = row.windows()
        calls, late = calls + before.calls, late + before.bad
        if row.process is None:
            calls, late = calls + after.calls, late + after.bad
    return faultwindow.Tally(calls, late)


def _edge_connections(admin_port: int) -> int | None:
    """Client connections an Envoy holds on its gRPC listener, from its admin page (None when
    the page does not answer)."""
    url = f"http://127.0.0.1:{admin_port}/stats?filter=^http%5C.grpc_edge%5C.downstream_cx_active$"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "http.grpc_edge.downstream_cx_active":
            return int(value)
    return None


def processes(mesh: Mesh) -> list[str]:
    """Every process of the mesh, in the order they are killed: front to back."""
    front = [n for n in mesh.processes if n.startswith("envoy")]
    front += [n for n in mesh.processes if n.startswith("gateway")]
    return front + [n for n in mesh.processes if n not in front]


class Crash:
    """Runs the crash matrix on a mesh it starts itself, on a fresh copy of ``var_dir``."""

    def __init__(self, var_dir: Path, work_dir: Path, plan: CrashPlan) -> None:
        self.plan = plan
        self.run_id = uuid.uuid4().hex[:8]
        self.var_dir = copy_state(var_dir, work_dir / f"state-{self.run_id}")
        self.log_dir = work_dir / f"logs-{self.run_id}"
        store = FeatureStoreSettings(var_dir=self.var_dir)
        mix = data.Mix(known=0.95, unknown=0.0, fraud=0.05)
        self.population = data.sample_population(store.data_path, 400, mix)
        self._ready_at: dict[str, float] = {}
        self._started: set[str] = set()
        self.reports: list[str] = []

    @contextlib.contextmanager
    def mesh(self) -> Iterator[Mesh]:
        """The mesh, started, with a supervisor restarting what dies, until the block ends."""
        config = self.plan.mesh_config(self.var_dir, self.log_dir)
        mesh = Mesh(config)

        def ready(name: str) -> None:
            first = name not in self._started
            self._started.add(name)
            self._ready_at[name] = time.monotonic()
            # A fresh redis-server is empty; with the event log on it, it keeps its data
            # across a restart (append-only file), without, it has to be filled again.
            if name == "redis" and (first or config.eventlog_backend != "redis"):
                settings = from_mapping(FeatureStoreSettings, config.service_env())
                store_admin.materialize(settings)

        mesh.start(timeout_s=180, on_ready=ready)
        stop = threading.Event()
        policy = RestartPolicy(max_crashes=3, window_s=600)
        supervisor = Supervisor(mesh, policy, on_ready=ready, report=self.reports.append)
        failure: list[BaseException] = []

        def supervise() -> None:
            try:
                supervisor.run(stop)
            except CrashLoop as error:
                failure.append(error)

        thread = threading.Thread(target=supervise, name="crash-supervisor", daemon=True)
        thread.start()
        try:
            yield mesh
        finally:
            stop.set()
            thread.join(10)
            mesh.stop()
        if failure:
            raise RuntimeError(f"the supervisor gave up: {failure[0]}")

    def run(
        self, names: Sequence[str] | None = None, log: Callable[[str], None] = print
    ) -> list[Row]:
        """The baseline row, then a row per process (or per name in ``names``), then the
        decision log's check; returns the rows."""
        rows: list[Row] = []
        with self.mesh() as mesh:
            wanted = [n for n in processes(mesh) if names is None or n in names]
            unknown = set(names or ()) - set(mesh.processes)
            if unknown:
                raise ValueError(
                    f"no such processes {sorted(unknown)}; the mesh runs {list(mesh.processes)}"
                )
            for name in [None, *wanted]:
                self._settle(mesh)
                row = self._row(mesh, name)
                log(
                    f"{row.name}: {len(row.calls)} calls, {len(row.failed())} failed, "
                    f"{row.windows()[1]} late after the kill"
                )
                rows.append(row)
            self._check_log(mesh.config, rows, log)
        pooled = reference(rows)
        for row in rows:
            row.reference = pooled
        return rows

    def _row(self, mesh: Mesh, name: str | None) -> Row:
        plan = self.plan
        row = Row(name)
        prefix = f"crash-{self.run_id}-{name or 'baseline'}"
        load = Load(
            mesh.config.envoy_target,
            self.population,
            plan.rps,
            plan.connections,
            prefix=prefix,
            work_dir=self.log_dir,
        )
        load.start()
        time.sleep(plan.before_s)
        row.kill_s = time.monotonic()
        if name is not None:
            if row.edge:
                row.connections_at_kill = _edge_connections(
                    mesh.config.replica_ports("envoy")[name]
                )
            self._ready_at.pop(name, None)
            mesh.processes[name].signal(signal.SIGKILL)
        time.sleep(plan.after_s)
        if name is not None:
            # A restart slower than the row (a loaded machine) keeps the load going until
            # the process is back and answers have had ``tail_s`` to show it.
            deadline = row.kill_s + plan.max_after_s
            while name not in self._ready_at and time.monotonic() < deadline:
                time.sleep(0.1)
            at = self._ready_at.get(name)
            if at is not None:
                time.sleep(max(0.0, at + plan.tail_s - time.monotonic()))
                # Breakers close some seconds after their dependency is back: go on until
                # the last ``tail_s`` of answers were all at full quality.
                while time.monotonic() < deadline and not _steady(load.snapshot(), plan.tail_s):
                    time.sleep(0.2)
            row.ready_again_s = None if at is None else at - row.kill_s
        row.calls = load.stop()
        return row

    def _settle(self, mesh: Mesh, timeout_s: float = 120.0) -> None:
        """Waits until every process runs and ready, and answers are at full quality again."""
        deadline = time.monotonic() + timeout_s
        target = mesh.config.envoy_target
        while time.monotonic() < deadline:
            alive = all(p.alive() and p.ready() for p in mesh.processes.values())
            if alive and self._full_quality(target):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the mesh did not settle within {timeout_s:.0f} s")

    def _full_quality(self, target: str) -> bool:
        txn = next(t for t in self.population if t.kind == "known")
        with client.PLAINTEXT.channel(target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            try:
                for _ in range(5):
                    answer = stub.Score(
                        score_request(txn, f"settle-{uuid.uuid4().hex}"), timeout=1.0
                    )
                    if (
                        answer.scored_by not in VERSION_ANSWERS
                        or answer.feature_source == pb.FEATURE_SOURCE_DEFAULT
                    ):
                        return False
            except grpc.RpcError:
                return False
        return True

    def _check_log(self, config: MeshConfig, rows: list[Row], log: Callable[[str], None]) -> None:
        """Waits until the decision log holds every answered decision (or ``log_wait_s``
        passed) and records in each row which it misses."""
        root = from_mapping(DecisionLogSettings, config.decisionlog_env()).root_path
        wanted = {c.transaction_id for row in rows for c in row.answered()}
        deadline = time.monotonic() + self.plan.log_wait_s
        held: set[str] = set()
        while True:
            table = reader.read_table(root, "decisions", columns=["transaction_id"])
            held = set(table.column("transaction_id").to_pylist())
            if wanted <= held or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        for row in rows:
            row.missing = sorted(
                c.transaction_id for c in row.answered() if c.transaction_id not in held
            )
        log(f"decision log: {len(wanted & held)} of {len(wanted)} answered decisions")


def summary(rows: Sequence[Row], plan: CrashPlan) -> dict[str, object]:
    """The matrix's figures, for a results file."""
    out_rows = []
    for row in rows:
        before, after = row.windows()
        out_rows.append(
            {
                "killed": row.process,
                "calls": len(row.calls),
                "failed": len(row.failed()),
                "failures_allowed": row.failures_allowed(),
                "in_flight_at_kill": row.in_flight_at_kill(),
                "connections_at_kill": row.connections_at_kill,
                "late_before": before.bad,
                "calls_before": before.calls,
                "late_after": after.bad,
                "calls_after": after.calls,
                "late_allowed": row.late_allowed(),
                "answered": len(row.answered()),
                "missing": len(row.missing),
                "ready_again_s": row.ready_again_s,
                "quality_back_s": row.quality_back_s(),
                "degraded_after": sum(
                    1 for c in row.calls if c.degraded and c.ended_s >= row.kill_s
                ),
                "passed": row.passed(),
                "problems": row.problems(),
            }
        )
    pooled = reference(rows)
    return {
        "plan": {
            k: getattr(plan, k)
            for k in (
                "rps",
                "before_s",
                "after_s",
                "connections",
                "store",
                "gateway_replicas",
                "envoy_replicas",
                "features_replicas",
                "scorer_replicas",
                "journal",
            )
        },
        "reference": {"calls": pooled.calls, "late": pooled.bad},
        "rows": out_rows,
    }


def markdown(rows: Sequence[Row], plan: CrashPlan) -> str:
    """The matrix as a Markdown table."""
    lines = [
        f"SIGKILL of each process in turn under {plan.rps} calls/s through Envoy (the project's "
        f"Python client, {plan.connections} connections, 42 ms deadline, retries on UNAVAILABLE); "
        f"{plan.gateway_replicas} gateway(s), {plan.envoy_replicas} Envoy(s), "
        f"{plan.features_replicas} feature service(s), {plan.scorer_replicas} scorer(s), "
        f"{plan.store} store, journal {plan.journal}; each row {plan.before_s:.0f} s of load "
        f"before the kill and {plan.after_s:.0f} s after it, a supervisor restarting what dies.",
        "",
        f"Late: DEADLINE_EXCEEDED or OK past {BUDGET_MS:.0f} ms; the window from the kill on "
        f"may have the late share of the run's unfaulted calls (the baseline row and every "
        f"row before its kill: {reference(rows)}) plus max({faultwindow.SLACK_CALLS} calls, "
        f"{faultwindow.SLACK_SHARE:.0%}). Failed: any other status; none allowed but, for an Envoy, the "
        "calls in flight at the kill. Missing: answered decisions the decision log does not "
        "hold at the end of the run. Quality back: until the last answer by the rules or on "
        "default features.",
        "",
        "| killed | calls | failed (allowed) | late before | late after (allowed) | "
        "missing from the log | ready again | quality back | pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        before, after = row.windows()
        back = row.quality_back_s()
        ready = (
            "-"
            if row.process is None
            else ("never" if row.ready_again_s is None else f"{row.ready_again_s:.1f} s")
        )
        verdict = "PASS" if row.passed() else "FAIL: " + "; ".join(row.problems())
        lines.append(
            f"| {row.name} | {len(row.calls)} | {len(row.failed())} ({row.failures_allowed()}) "
            f"| {before} | {after} ({row.late_allowed()}) "
            f"| {len(row.missing)} of {len(row.answered())} | {ready} "
            f"| {'not back' if back is None else f'{back:.2f} s'} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
