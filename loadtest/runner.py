"""The load-test runner behind ``fraudmesh loadtest`` and ``make loadtest``.

Starts a mesh on free ports (unless pointed at a running one), writes fresh request data,
then drives ``Score`` through Envoy open loop at each rate of a schedule, stopping once the
mesh is saturated. For every step it records ghz's figures and the peak RSS of every mesh
process, and writes a Markdown report, a PNG plot and a JSON summary.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

from loadtest import data, ghz, provenance, report
from loadtest.priority import normal_priority
from loadtest.rss import RssSampler
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port, grpc_serving
from services.mesh.topology import OBSERVABILITY
from services.models import repository

DEFAULT_RATES: tuple[int, ...] = (100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200)
"""Offered rates (requests/s) of the default schedule."""

RESULTS_DIR = ghz.REPO_ROOT / "loadtest" / "results"
"""Where reports go unless told otherwise."""

Log = Callable[[str], None]


@dataclass(frozen=True)
class LoadtestConfig:
    """What one load test runs."""

    var_dir: Path = Path("var")
    """State folder with simulated data, Feast registry and a published model."""
    store: str = "sqlite"
    """Online store of the mesh this runner starts: sqlite or redis."""
    rates: Sequence[int] = DEFAULT_RATES
    """Offered rates, ascending."""
    step_s: float = 10.0
    """Length of each step."""
    warmup_s: float = 3.0
    """Unrecorded traffic at the first rate before the schedule starts."""
    deadline_ms: float = 42.0
    """Each call's deadline (grpc-timeout): the payment system's budget."""
    requests: int = 2000
    """Distinct requests in the data file (sent round robin)."""
    saturated_steps: int = 2
    """Stop after this many consecutive saturated steps."""
    target: str | None = None
    """host:port of a running Envoy (or gateway); None starts a mesh on free ports."""
    edge_rate_limit: int = 1000
    """Envoy's local rate limit (rps) of the mesh started here; calls beyond it are shed."""
    out_dir: Path = RESULTS_DIR
    """Folder of the report files."""
    name: str | None = None
    """Base name of the report files; default ``loadtest-<store>``."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the services of a started mesh (tuning experiments)."""
    gateway_replicas: int = 1
    """Gateway processes behind Envoy in a started mesh."""
    gateway_in_process: bool = False
    """The started mesh's gateways read the store and run the model in process."""
    live_loop: bool = True
    """The started mesh emits decision events and runs the feature updater."""
    observability: bool = False
    """The started mesh runs Prometheus and the trace collector, as ``fraudmesh up`` does."""

    @property
    def variant(self) -> str:
        """How the started mesh differs from the default, for names and titles."""
        parts = ["in-process"] if self.gateway_in_process else []
        if not self.live_loop:
            parts.append("no-loop")
        if self.gateway_replicas > 1:
            parts.append(f"{self.gateway_replicas}gw")
        if self.observability:
            parts.append("observed")
        return "-".join(parts)

    @property
    def report_name(self) -> str:
        """Base name of the report files."""
        return self.name or "-".join(filter(None, ("loadtest", self.store, self.variant)))


@dataclass(frozen=True)
class LoadtestReport:
    """The steps a run made and the files it wrote."""

    steps: list[report.Step]
    markdown: Path
    plot: Path
    summary: Path
    processes: list[str]

    @property
    def results(self) -> list[ghz.Result]:
        """Each step's ghz result."""
        return [s.result for s in self.steps]


def saturated(result: ghz.Result, budget_ms: float = report.BUDGET_MS) -> bool:
    """A step the mesh did not sustain: errors above 1 %, p99 past the budget, or fewer than
    95 % of the offered calls answered per second."""
    return (
        result.error_share > 0.01
        or result.p99_ms > budget_ms
        or result.achieved_rps < 0.95 * result.offered_rps
    )


def gateway_answers(metrics_url: str) -> Callable[[], dict[str, float]]:
    """Reads the gateway's decisions counter from its /metrics, summed by ``scored_by=…`` and
    ``feature_source=…``."""

    def read() -> dict[str, float]:
        page = scrape.fetch(metrics_url)
        return {
            f"{label}={value}": count
            for label in ("scored_by", "feature_source")
            for value, count in page.by_label(catalogue.DECISIONS, label).items()
        }

    return read


def check_state(var_dir: Path) -> None:
    """Fails with the command to run when data or a model is missing."""
    if not layout.data_present(var_dir / "data"):
        raise FileNotFoundError(f"no simulated data under {var_dir}/data: run `make data`")
    if repository.latest_version(var_dir / "models") is None:
        raise FileNotFoundError(f"no published model under {var_dir}/models: run `make data`")


def start_mesh(
    var_dir: Path,
    store: str,
    log_dir: Path,
    *,
    edge_rate_limit: int = 1000,
    extra_env: dict[str, str] | None = None,
    gateway_replicas: int = 1,
    gateway_in_process: bool = False,
    live_loop: bool = True,
    replicas: Mapping[str, int] | None = None,
    observability: bool = False,
    monitor: bool = True,
    log: Log = print,
) -> Mesh:
    """Starts a mesh on free ports on ``var_dir``; with Redis, materializes into it first.
    ``replicas`` gives ``envoy_replicas``, ``features_replicas``, ``scorer_replicas`` (and may
    override ``gateway_replicas``)."""
    counts = {"gateway_replicas": gateway_replicas, **(replicas or {})}
    gateway_replicas = counts.pop("gateway_replicas")
    gateways = ["gateway", *(f"gateway-{i}" for i in range(2, gateway_replicas + 1))]
    config = MeshConfig.on_free_ports(
        gateway_replicas=gateway_replicas,
        **counts,
        gateway_in_process=gateway_in_process,
        var_dir=var_dir,
        store=store,
        log_dir=log_dir,
        rate_limit_rps=edge_rate_limit,
        metrics_ports={name: free_port() for name in [*gateways, "updater", "monitor"]},
        extra_env=extra_env or {},
        live_loop=live_loop,
        observability=observability,
        monitor=monitor,
    )
    mesh = Mesh(config)

    def ready(name: str) -> None:
        log(f"ready: {name} (pid {mesh.processes[name].pid})")
        if name == "redis":
            log("materializing features into redis …")
            store_admin.materialize(
                FeatureStoreSettings(
                    var_dir=var_dir,
                    store="redis",
                    redis_connection=f"{config.host}:{config.redis_port}",
                )
            )

    mesh.start(timeout_s=180, on_ready=ready)
    normal_priority([p.pid for p in mesh.processes.values() if p.pid is not None])
    # Then each process's own niceness, as `fraudmesh up` runs it: the loop's consumers
    # below the request path, Envoy above it where configured.
    for process in mesh.processes.values():
        if process.niceness and process.pid is not None:
            process.normal_priority()
    return mesh


def mesh_answers(mesh: Mesh) -> Callable[[], dict[str, float]] | None:
    """The decision-counter reader of a mesh's gateways (summed over the replicas that
    expose /metrics), or None if none does."""
    readers = [
        gateway_answers(scrape.url(mesh.config.host, port))
        for name, port in mesh.config.metrics_ports.items()
        if name.startswith("gateway")
    ]
    if not readers:
        return None

    def read() -> dict[str, float]:
        total: dict[str, float] = {}
        for reader in readers:
            for key, value in reader().items():
                total[key] = total.get(key, 0.0) + value
        return total

    return read


def run_schedule(
    call: ghz.Call,
    target: str,
    data_file: Callable[[], Path],
    rates: Sequence[int],
    *,
    step_s: float,
    timeout_ms: float,
    pids: dict[str, int],
    warmup_s: float = 0.0,
    saturated_steps: int = 1,
    is_saturated: Callable[[ghz.Result], bool] = saturated,
    dead: Callable[[], Sequence[str]] = tuple,
    answers: Callable[[], dict[str, float]] | None = None,
    log: Log = print,
) -> list[report.Step]:
    """Runs ``call`` at each rate until ``saturated_steps`` consecutive steps saturate.

    ``data_file`` is called before every step, so request timestamps are fresh each time.
    ``dead`` names processes under test that have exited: checked after every step, so a
    crash (and a port another process may then take) never passes for a measurement.
    ``answers`` reads the gateway's decision counters; their growth over a step tells how
    many answers came from the rules or with default features (degraded, yet not errors).
    """
    if warmup_s > 0 and rates:
        ghz.run_ghz(
            call, target, data_file(), rps=rates[0], duration_s=warmup_s, timeout_ms=timeout_ms
        )
    steps: list[report.Step] = []
    bad = 0
    with RssSampler(pids) as sampler:
        for rps in rates:
            file = data_file()
            sampler.reset()
            before = answers() if answers is not None else {}
            cpu_before = sampler.cpu_seconds()
            result = ghz.run_ghz(
                call, target, file, rps=rps, duration_s=step_s, timeout_ms=timeout_ms
            )
            cpu_after = sampler.cpu_seconds()
            after = answers() if answers is not None else {}
            sampler.sample()
            gone = dead()
            if gone:
                raise RuntimeError(f"exited during the {rps} rps step: {', '.join(gone)}")
            grown = {k: v - before.get(k, 0.0) for k, v in after.items()}
            cpu = {
                n: (cpu_after[n] - cpu_before.get(n, 0.0)) * 1000 / max(result.count, 1)
                for n in cpu_after
            }
            steps.append(report.Step(result, sampler.reset(), cpu, grown))
            log(
                f"{rps:>5} rps: achieved {result.achieved_rps:.0f}, p50 {result.p50_ms:.2f} ms, "
                f"p99 {result.p99_ms:.2f} ms, p99.9 {result.p999_ms:.2f} ms, "
                f"errors {result.error_share:.2%}"
            )
            bad = bad + 1 if is_saturated(result) else 0
            if bad >= saturated_steps:
                break
    return steps


def machine_line() -> str:
    """CPU count, load average and Python: the conditions a number was measured in."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs, load average {load} at the end, {platform.python_implementation()} "
        f"{platform.python_version()}, commit {provenance.git_commit()}"
    )


def write_report(
    cfg: LoadtestConfig,
    steps: Sequence[report.Step],
    processes: Sequence[str],
    started: datetime,
) -> LoadtestReport:
    """Writes the Markdown report, the plot and the JSON summary of a run."""
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    name = cfg.report_name
    results = [s.result for s in steps]
    what = f"{cfg.store} store" + (f", {cfg.variant}" if cfg.variant else "")
    png = report.plot(
        {f"Score via Envoy ({what})": steps},
        out / f"{name}.png",
        f"fraudmesh Score through Envoy, {what}: latency vs offered rate",
    )
    best = report.max_sustainable(results)
    at400 = report.at_rate(results, 400)
    peak = {p: max((s.peak_rss.get(p, 0) for s in steps), default=0) for p in processes}
    lines = [
        f"# Load test: Score through Envoy ({what})",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC; {machine_line()}.",
        f"ghz open loop (`--async --count-errors`), {cfg.step_s:g} s per step, deadline "
        f"{cfg.deadline_ms:g} ms per call, {cfg.requests} distinct requests (known cards, "
        "unknown cards, fraud-like) stamped at the start of each step; "
        + (f"{cfg.gateway_replicas} gateway replicas; " if cfg.gateway_replicas > 1 else "")
        + (
            "gateway with the store read and the model in process (`FRAUD_GATEWAY_IN_PROCESS`); "
            if cfg.gateway_in_process
            else ""
        )
        + (
            "live loop on (decision events, feature updater); "
            if cfg.live_loop
            else "live loop off (no decision events, no updater); "
        )
        + f"Envoy's edge rate limit {cfg.edge_rate_limit} rps. Percentiles from every call's latency, errors "
        "included; peak RSS sampled every 0.2 s.",
        "",
        report.steps_table(steps, processes),
        "",
        "CPU milliseconds per call, by process (user + system, over the step):",
        "",
        report.cpu_table(steps),
        "",
        f"![latency percentiles and degraded answers vs rate]({png.name})",
        "",
        "## Against the targets",
        "",
    ]
    if at400 is not None:
        verdict = "met" if at400.ok(10.0) else "missed"
        lines.append(
            f"- p99 at 400 rps: {at400.p99_ms:.2f} ms, errors {at400.error_share:.2%} "
            f"(target ≤ 10 ms, 0 errors: {verdict})"
        )
    step400 = next((st for st in steps if st.result is at400), None)
    if step400 is not None and step400.answers:
        lines.append(
            f"- answers at 400 rps: {step400.share('feature_source=default') or 0:.1%} with "
            f"default features, {step400.share('scored_by=rules') or 0:.1%} by the rules"
        )
    if best is not None:
        verdict = "met" if best.offered_rps >= 700 else "missed"
        lines.append(
            f"- highest sustained rate (p99 ≤ 42 ms, 0 errors): {best.offered_rps:.0f} rps "
            f"(target ≥ 700: {verdict})"
        )
    else:
        lines.append("- no step was sustained with p99 ≤ 42 ms and 0 errors")
    if any(st.answers for st in steps):
        full = report.max_full_quality(steps)
        lines.append(
            "- highest sustained rate with full-quality answers (also under 5 % default "
            "features and 1 % rules): "
            + (f"{full.result.offered_rps:.0f} rps" if full is not None else "none")
        )
    if peak:
        worst = max(peak.values()) / 2**20
        verdict = "met" if worst <= 400 else "missed"
        lines.append(
            "- peak RSS: "
            + ", ".join(f"{p} {v / 2**20:.0f} MB" for p, v in peak.items())
            + f" (target ≤ 400 MB per service: {verdict})"
        )
    md = out / f"{name}.md"
    prov = provenance.record()
    md.write_text(provenance.markdown("\n".join(lines) + "\n", prov))
    summary = out / f"{name}.json"
    summary.write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "started": started.isoformat(),
                "store": cfg.store,
                "step_s": cfg.step_s,
                "deadline_ms": cfg.deadline_ms,
                "steps": [s.to_dict() for s in steps],
            },
            indent=2,
        )
    )
    return LoadtestReport(list(steps), md, png, summary, list(processes))


def copy_state(source: Path, target: Path) -> Path:
    """A fresh state folder at ``target``: the dataset, the Feast registry and online store
    and the models of ``source``, without any live-loop state (event log, updater state,
    decision log), so that a mesh started on it replays nothing an earlier run left."""
    for name in ("data", "feast", "models"):
        shutil.copytree(source / name, target / name, symlinks=True)
    return target


def request_source(population: Sequence[data.Txn], path: Path) -> Callable[[], Path]:
    """Writes the request mix to ``path`` with timestamps of now, each time it is called."""

    def fresh() -> Path:
        return data.write_data_file(path, data.score_requests(population, "now"))

    return fresh


def check_env(mesh: Mesh, env: Mapping[str, str]) -> None:
    """Fails unless every service process of ``mesh`` runs with ``env`` (Envoy, Redis,
    Prometheus and the collector take none), so that no comparison passes off two alike
    meshes as two variants."""
    if not env:
        return
    for name, process in mesh.processes.items():
        if name.split("-")[0] in ("envoy", "redis") or name in OBSERVABILITY or process.pid is None:
            continue
        seen = psutil.Process(process.pid).environ()
        wrong = {k: seen.get(k) for k, v in env.items() if seen.get(k) != v}
        if wrong:
            raise RuntimeError(f"{name} runs with {wrong}, not {dict(env)} as asked")


def measure_mesh(
    cfg: LoadtestConfig,
    var_dir: Path,
    work: Path,
    requests: Callable[[], Path],
    *,
    extra_env: Mapping[str, str] | None = None,
    replicas: Mapping[str, int] | None = None,
    log: Log = print,
) -> tuple[list[report.Step], list[str]]:
    """Starts a mesh as ``cfg`` says on ``var_dir`` (with ``extra_env`` on top of the
    config's, and ``replicas`` as ``start_mesh`` takes them), runs the rate schedule through
    its Envoy, stops it; returns the steps and the measured processes' names."""
    env = {**cfg.extra_env, **(extra_env or {})}
    mesh = start_mesh(
        var_dir,
        cfg.store,
        work / "logs",
        edge_rate_limit=cfg.edge_rate_limit,
        extra_env=env,
        gateway_replicas=cfg.gateway_replicas,
        gateway_in_process=cfg.gateway_in_process,
        live_loop=cfg.live_loop,
        replicas=replicas,
        observability=cfg.observability,
        log=log,
    )
    try:
        check_env(mesh, env)
        pids = {n: p.pid for n, p in mesh.processes.items() if p.pid is not None}
        target = mesh.config.envoy_target
        log(f"load: Score via {target}, rates {list(cfg.rates)}, {cfg.step_s:g} s each")
        steps = run_schedule(
            ghz.SCORE,
            target,
            requests,
            cfg.rates,
            step_s=cfg.step_s,
            timeout_ms=cfg.deadline_ms,
            pids=pids,
            warmup_s=cfg.warmup_s,
            saturated_steps=cfg.saturated_steps,
            dead=lambda: [p.name for p in mesh.dead()],
            answers=mesh_answers(mesh),
            log=log,
        )
    finally:
        mesh.stop()
    return steps, list(pids)


def run(cfg: LoadtestConfig, log: Log = print) -> LoadtestReport:
    """Runs the whole load test and writes its report; stops any mesh it started."""
    check_state(cfg.var_dir)
    started = datetime.now(UTC)
    work = cfg.out_dir / f".{cfg.report_name}.tmp"
    population = data.sample_population(cfg.var_dir / "data", cfg.requests)
    requests = request_source(population, work / "score.json")
    if cfg.target is None:
        log(f"starting a mesh ({cfg.store} store) on free ports …")
        steps, processes = measure_mesh(cfg, cfg.var_dir, work, requests, log=log)
    else:
        if not grpc_serving(cfg.target, timeout_s=2.0):
            raise RuntimeError(f"nothing serving at {cfg.target}")
        log(f"load: Score via {cfg.target}, rates {list(cfg.rates)}, {cfg.step_s:g} s each")
        steps = run_schedule(
            ghz.SCORE,
            cfg.target,
            requests,
            cfg.rates,
            step_s=cfg.step_s,
            timeout_ms=cfg.deadline_ms,
            pids={},
            warmup_s=cfg.warmup_s,
            saturated_steps=cfg.saturated_steps,
            log=log,
        )
        processes = []
    result = write_report(cfg, steps, processes, started)
    _clean(work)
    return result


def _clean(work: Path) -> None:
    """Removes the run's scratch folder (data files, logs) after a successful run."""
    if not work.exists():
        return
    for path in sorted(work.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()
    work.rmdir()
