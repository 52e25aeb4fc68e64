"""Side-by-side benchmarks behind ``make bench``, each side run once on the same machine.

- ``floor``: the mesh (Redis store) against its no-work floor (``loadtest.noop``): the same
  Envoy + gateway + two grpc.aio hops answering fixed messages. Ratio of p50 at 400 rps and
  of the highest sustained rate (p99 ≤ 42 ms, no errors). A third side, the bare gRPC
  floor, runs the topology with none of the project's code (plain grpc.aio, raw bytes).
- ``scorer``: the scorer against MLServer 1.7 (``mlserver`` + ``mlserver-lightgbm`` in their
  own virtual environment) serving the same LightGBM model (``lightgbm.txt`` of the same
  published version), both driven by ghz ``ModelInfer`` with identical requests and rates.
- ``features``: the feature service (gRPC, ghz) against ``feast serve`` (HTTP, fortio) on
  the same Redis, registry and data, both asked for the same known card, merchant and
  terminal (feast serve needs every join key of the feature service's views).

Every side climbs its own rate ladder (``Ladder``): the listed rates, where the comparison's
fixed rates are, then on past them until that side misses its criterion, within a rate and
a time bound; a side still meeting it at a bound is reported as "at least".

Each writes ``bench-<name>.md`` (table, verdicts), ``.png`` and ``.json`` into the results
folder. Run with ``python -m loadtest.bench [--only floor,scorer,features]``; a short run
(``--rates 50,100 --step-seconds 2 --max-rps 200 --max-side-seconds 30 --out DIR``) checks
the set-up end to end.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from loadtest import data, fortio, ghz, noop, provenance, report, runner
from loadtest.priority import normal_priority
from services.domain import featurespec
from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.repo import definitions
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Process, free_port, grpc_serving, http_ok, tcp_open
from services.models import repository
from services.models.lifecycle import ModelLifecycle

Log = Callable[[str], None]

FLOOR_RATES = (100, 200, 300, 400, 500, 600, 700, 800, 1000, 1200, 1500)
SCORER_RATES = (50, 100, 250, 500, 750, 1000, 1250, 1500, 2000)
FEATURE_RATES = (25, 50, 100, 200, 300, 400, 600, 800, 1000)

MLSERVER_VENV = ghz.REPO_ROOT / "build" / "mlserver-venv"
"""Where ``make bench`` installs MLServer (never into the project's .venv)."""


MAX_RPS = 10_000
"""Highest rate a ladder offers by default: past it a side is reported as at least that."""
MAX_SIDE_S = 900.0
"""Default bound on the seconds one side's steps may take, warm-up and pauses included."""


@dataclass(frozen=True)
class Ladder:
    """The rates one side climbs: the listed ones, then on until it misses its criterion.

    The criterion is the comparison's (p99 within ``limit_ms``, no errors) and at least 95 %
    of the offered rate answered: a load generator that falls behind does not pass for a
    side that keeps up. The listed rates run in order (the fixed rates the verdicts compare
    at are among them) unless the side collapses; past them each next rate is the last ×
    ``growth``, rounded up to a multiple of 50 (``max_rps`` at most), until ``misses``
    steps in a row miss the criterion, a step has run at ``max_rps`` or the next step would
    end past ``max_s`` seconds of the side's steps.
    """

    rates: tuple[int, ...]
    limit_ms: float
    growth: float = 1.25
    max_rps: int = MAX_RPS
    max_s: float = MAX_SIDE_S
    misses: int = 2

    def listed(self) -> tuple[int, ...]:
        """The listed rates within the rate bound."""
        return tuple(r for r in self.rates if r <= self.max_rps)

    def holds(self, result: ghz.Result) -> bool:
        """The side met its criterion at this step."""
        return result.ok(self.limit_ms) and result.achieved_rps >= 0.95 * result.offered_rps

    def missed(self, results: Sequence[ghz.Result]) -> bool:
        """The last ``misses`` steps all missed the criterion."""
        tail = results[-self.misses :]
        return len(tail) == self.misses and not any(self.holds(r) for r in tail)

    def next_rate(self, last_rps: float) -> int:
        """The rate after ``last_rps`` past the listed ones."""
        return max(int(last_rps) + 50, math.ceil(last_rps * self.growth / 50) * 50)


RunSteps = Callable[[Sequence[int], bool], list[report.Step]]
"""Runs a side at the given rates (warming it up first when the flag is set) and returns
its steps, stopping early when the side collapses."""


def climb(
    ladder: Ladder,
    run: RunSteps,
    collapsed: Callable[[ghz.Result], bool],
    *,
    step_s: float,
    saturated_steps: int = 2,
    clock: Callable[[], float] = time.monotonic,
    log: Log = print,
) -> tuple[list[report.Step], str]:
    """Runs ``ladder`` on one side: its steps and why the climb stopped."""
    started = clock()
    steps = run(ladder.listed(), True)
    while True:
        results = [s.result for s in steps]
        if not results:
            return steps, "no rate within the bound"
        tail = results[-saturated_steps:]
        if len(tail) == saturated_steps and all(collapsed(r) for r in tail):
            return steps, f"collapsed at {tail[-1].offered_rps:.0f} rps"
        if len(results) >= len(ladder.listed()) and ladder.missed(results):
            return steps, (
                f"missed p99 ≤ {ladder.limit_ms:g} ms, 0 errors, ≥ 95 % answered at "
                f"{ladder.misses} rates in a row, the last {results[-1].offered_rps:.0f} rps"
            )
        last = results[-1].offered_rps
        if last >= ladder.max_rps:
            return steps, f"rate bound: {ladder.max_rps} rps reached"
        rps = min(ladder.next_rate(last), ladder.max_rps)
        if clock() - started + step_s > ladder.max_s:
            return steps, f"time bound: {ladder.max_s:g} s of steps"
        log(f"still within p99 ≤ {ladder.limit_ms:g} ms: on to {rps} rps")
        steps += run([rps], False)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a label, its steps and how its ladder ended."""

    label: str
    steps: list[report.Step]
    ladder: Ladder | None = None
    stop: str = ""

    @property
    def results(self) -> list[ghz.Result]:
        """Each step's result."""
        return [s.result for s in self.steps]

    def best(self) -> ghz.Result | None:
        """The highest-rate step that met the ladder's criterion (None if none did)."""
        if self.ladder is None:
            return report.max_sustainable(self.results)
        good = [r for r in self.results if self.ladder.holds(r)]
        return max(good, key=lambda r: r.offered_rps) if good else None

    @property
    def bounded(self) -> bool:
        """The ladder stopped at a bound while the side still met its criterion."""
        best, results = self.best(), self.results
        return (
            best is not None
            and bool(results)
            and best is results[-1]
            and self.stop.startswith(("rate bound", "time bound"))
        )


def _collapsed(result: ghz.Result) -> bool:
    """Saturated past use: a fifth of the calls failing or under 90 % answered per second
    (the floor comparison keeps going through moderate errors to have both sides at 400)."""
    return result.error_share > 0.2 or result.achieved_rps < 0.9 * result.offered_rps


def _loose(result: ghz.Result) -> bool:
    """Saturated for a capacity sweep: errors above 1 % or under 90 % of the rate answered."""
    return result.error_share > 0.01 or result.achieved_rps < 0.9 * result.offered_rps


def _exited(process: Process) -> Callable[[], list[str]]:
    return lambda: [] if process.alive() else [process.name]


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def _best(label: str, side: Side) -> str:
    """``label N rps`` (``at least N`` when its ladder stopped at a bound), or why there is
    no such rate."""
    best, results = side.best(), side.results
    if best is not None:
        return f"{label} {'at least ' if side.bounded else ''}{best.offered_rps:.0f} rps"
    if not results:
        return f"{label}: not run"
    low = min(results, key=lambda r: r.offered_rps)
    return (
        f"{label}: no step (its lowest, {low.offered_rps:.0f} rps, had p99 "
        f"{low.p99_ms:.2f} ms and {low.error_share:.2%} errors)"
    )


def _rate(side: Side) -> float | None:
    best = side.best()
    return best.offered_rps if best is not None else None


def _bound_note(ours: Side, theirs: Side) -> str:
    """What a ratio of the two sides' highest rates means when a ladder hit a bound."""
    if ours.bounded and theirs.bounded:
        return " (both at a bound of the ladder: no ratio can be read)"
    if ours.bounded:
        return " (at least: the first side still held at the ladder's bound)"
    if theirs.bounded:
        return " (at most: the second side still held at the ladder's bound)"
    return ""


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _write(
    out_dir: Path,
    name: str,
    title: str,
    intro: str,
    sides: Sequence[Side],
    verdicts: Sequence[str],
    budget_ms: float | None,
    processes: dict[str, Sequence[str]],
) -> Path:
    """Writes ``bench-<name>.md``/``.png``/``.json``: one table per side, then the verdicts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = report.plot(
        {s.label: s.steps for s in sides}, out_dir / f"bench-{name}.png", title, budget_ms
    )
    lines = [
        f"# {title}",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {runner.machine_line()}.",
        "",
    ]
    lines += [intro, ""]
    for side in sides:
        lines += [
            f"## {side.label}",
            "",
            report.steps_table(side.steps, processes.get(side.label, ())),
            "",
            "CPU milliseconds per call, by process:",
            "",
            report.cpu_table(side.steps),
            "",
        ]
        if side.stop:
            lines += [f"Rate ladder: stopped: {side.stop}.", ""]
    lines += [f"![latency percentiles vs rate]({png.name})", "", "## Verdict", ""]
    lines += [f"- {v}" for v in verdicts]
    md = out_dir / f"bench-{name}.md"
    prov = provenance.record()
    md.write_text(provenance.markdown("\n".join(lines) + "\n", prov))
    (out_dir / f"bench-{name}.json").write_text(
        json.dumps(
            provenance.attach({s.label: [st.to_dict() for st in s.steps] for s in sides}, prov),
            indent=2,
        )
    )
    return md


def _score_data(var_dir: Path, work: Path, n: int = 2000) -> Callable[[], Path]:
    population = data.sample_population(var_dir / "data", n)

    def fresh() -> Path:
        return data.write_data_file(work / "score.json", data.score_requests(population, "now"))

    return fresh


def _ghz_side(
    label: str,
    ladder: Ladder,
    call: ghz.Call,
    target: str,
    data_file: Callable[[], Path],
    *,
    step_s: float,
    timeout_ms: float,
    pids: dict[str, int],
    collapsed: Callable[[ghz.Result], bool],
    dead: Callable[[], Sequence[str]],
    answers: Callable[[], dict[str, float]] | None = None,
    log: Log = print,
) -> Side:
    """One side driven by ghz up its ladder."""

    def run(rates: Sequence[int], warm: bool) -> list[report.Step]:
        return runner.run_schedule(
            call, target, data_file, rates, step_s=step_s, timeout_ms=timeout_ms, pids=pids,
            warmup_s=3.0 if warm else 0.0, saturated_steps=2, is_saturated=collapsed,
            dead=dead, answers=answers, log=log,
        )  # fmt: skip

    steps, stop = climb(ladder, run, collapsed, step_s=step_s, log=log)
    log(f"{label}: the ladder stopped: {stop}")
    return Side(label, steps, ladder, stop)


def bench_floor(
    var_dir: Path,
    out_dir: Path,
    *,
    ladder: Ladder | None = None,
    step_s: float = 10.0,
    store: str = "redis",
    log: Log = print,
) -> Path:
    """The mesh against its no-work floor, Score through Envoy, same data and rates."""
    ladder = ladder or Ladder(FLOOR_RATES, report.BUDGET_MS)
    work = out_dir / ".bench-floor.tmp"
    fresh = _score_data(var_dir, work)
    # The edge's token bucket is raised so that both sides show their own capacity.
    edge_limit = 100_000
    sides: list[Side] = []
    names: dict[str, Sequence[str]] = {}

    log("floor: the mesh …")
    mesh = runner.start_mesh(
        var_dir, store, work / "mesh-logs", edge_rate_limit=edge_limit, log=log
    )
    try:
        pids = {n: p.pid for n, p in mesh.processes.items() if p.pid is not None}
        label = f"mesh ({store})"
        sides.append(
            _ghz_side(
                label, ladder, ghz.SCORE, mesh.config.envoy_target, fresh, step_s=step_s,
                timeout_ms=42.0, pids=pids, collapsed=_collapsed,
                dead=lambda: [p.name for p in mesh.dead()], answers=runner.mesh_answers(mesh),
                log=log,
            )
        )  # fmt: skip
        names[label] = list(pids)
    finally:
        mesh.stop()

    for label, bare in (("no-work floor", False), ("bare gRPC floor", True)):
        log(f"floor: the {label} …")
        floor = noop.FloorMesh(
            work / ("bare-logs" if bare else "floor-logs"), rate_limit_rps=edge_limit, bare=bare
        )
        floor.start()
        try:
            pids = floor.pids()
            sides.append(
                _ghz_side(
                    label, ladder, ghz.SCORE, floor.envoy_target, fresh, step_s=step_s,
                    timeout_ms=42.0, pids=pids, collapsed=_collapsed, dead=floor.dead, log=log,
                )
            )  # fmt: skip
            names[label] = list(pids)
        finally:
            floor.stop()

    real, empty, bare_results = sides[0].results, sides[1].results, sides[2].results
    r400, f400 = report.at_rate(real, 400), report.at_rate(empty, 400)
    p50_ratio = _ratio(r400.p50_ms if r400 else None, f400.p50_ms if f400 else None)
    rate_ratio = _ratio(_rate(sides[0]), _rate(sides[1]))
    verdicts = [
        f"p50 at 400 rps: mesh {_fmt(r400.p50_ms if r400 else None, ' ms')}, floor "
        f"{_fmt(f400.p50_ms if f400 else None, ' ms')}, ratio {_fmt(p50_ratio, '×')} "
        f"(target ≤ 1.5×: {'met' if p50_ratio is not None and p50_ratio <= 1.5 else 'missed'})",
        f"highest sustained rate (p99 ≤ 42 ms, 0 errors, ≥ 95 % answered): "
        f"{_best('mesh', sides[0])}, {_best('floor', sides[1])}, ratio "
        f"{_fmt(rate_ratio, '×')}{_bound_note(sides[0], sides[1])}",
    ]
    if r400 is not None:
        verdicts.append(
            f"mesh p99 at 400 rps: {r400.p99_ms:.2f} ms with {r400.error_share:.2%} errors "
            f"(target ≤ 10 ms, 0 errors: {'met' if r400.ok(10.0) else 'missed'})"
        )
    step400 = next((st for st in sides[0].steps if st.result is r400), None)
    if step400 is not None and step400.answers:
        default = step400.share("feature_source=default") or 0
        rules = step400.share("scored_by=rules") or 0
        verdicts.append(
            (
                "but the mesh's answers at 400 rps were degraded: "
                if default >= 0.05 or rules >= 0.01
                else "the mesh's answers at 400 rps were full quality: "
            )
            + f"{default:.1%} with default features, {rules:.1%} by the rules; the floor "
            "always makes both downstream calls"
        )
    full = [
        st
        for st in sides[0].steps
        if (st.share("feature_source=default") or 0) < 0.05
        and (st.share("scored_by=rules") or 0) < 0.01
        and st.result.error_count == 0
    ]
    if full:
        top = max(full, key=lambda st: st.result.offered_rps).result
        twin = report.at_rate(empty, top.offered_rps)
        if twin is not None:
            verdicts.append(
                f"highest rate with full-quality answers (under 5 % default features, under "
                f"1 % rules, 0 errors): {top.offered_rps:.0f} rps; there the p50 ratio is "
                f"{_fmt(_ratio(top.p50_ms, twin.p50_ms), '×')} ({top.p50_ms:.2f} vs "
                f"{twin.p50_ms:.2f} ms) and CPU per call "
                f"{sum(sides[0].steps[real.index(top)].cpu_ms_per_call.values()):.2f} vs "
                f"{sum(sides[1].steps[empty.index(twin)].cpu_ms_per_call.values()):.2f} ms"
            )
    b400 = report.at_rate(bare_results, 400)
    if b400 is not None:
        verdicts.append(
            f"bare gRPC floor (no project code at all) at 400 rps: p50 {b400.p50_ms:.2f} ms, "
            f"p99 {b400.p99_ms:.2f} ms, errors {b400.error_share:.2%}; highest sustained rate "
            f"{_best('bare', sides[2])}"
        )
    intro = (
        f"Score through Envoy, ghz open loop, {step_s:g} s per step, 42 ms deadline, the same "
        "2,000-request mix for all three. The no-work floor is the same topology (Envoy with "
        "the same bootstrap, a gateway calling a feature service then a scorer, shared server "
        "runtime and channel options) whose servers answer prebuilt messages of the real "
        "sizes. The bare gRPC floor is that topology with none of the project's code: plain "
        "grpc.aio servers passing prebuilt bytes (`python -m loadtest.noop --bare`). "
        f"Envoy's rate limit raised to {edge_limit} rps on all so each shows its own capacity."
    )
    md = _write(out_dir, "floor", "Mesh vs its no-work floor", intro, sides, verdicts, 42.0, names)
    shutil.rmtree(work, ignore_errors=True)
    return md


def mlserver_repo(
    folder: Path, model_dir: Path, metadata: repository.ModelMetadata, ports: dict[str, int]
) -> Path:
    """Writes MLServer's settings.json and model-settings.json for the LightGBM text model."""
    booster = model_dir / "lightgbm.txt"
    if not booster.is_file():
        raise FileNotFoundError(
            f"{booster} is missing: the bench needs the LightGBM text model that training "
            "saves next to model.onnx (retrain with `fraudmesh train`)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": ports["http"],
                "grpc_port": ports["grpc"],
                "metrics_port": ports["metrics"],
                # Its multiprocess metrics files default to ./.metrics of the caller.
                "metrics_dir": str((folder / "metrics").resolve()),
                "debug": False,
            },
            indent=2,
        )
    )
    model_folder = folder / metadata.name
    model_folder.mkdir(exist_ok=True)
    (model_folder / "model-settings.json").write_text(
        json.dumps(
            {
                "name": metadata.name,
                "implementation": "mlserver_lightgbm.LightGBMModel",
                "parameters": {"uri": str(booster.resolve()), "version": metadata.version},
            },
            indent=2,
        )
    )
    return folder


def _mlserver_binary(venv: Path) -> Path:
    binary = venv / "bin" / "mlserver"
    if not binary.is_file():
        raise FileNotFoundError(
            f"no MLServer in {venv}: `make bench` installs it (mlserver==1.7.1, "
            "mlserver-lightgbm==1.7.1) into its own virtual environment"
        )
    return binary


def bench_scorer(
    var_dir: Path,
    out_dir: Path,
    *,
    ladder: Ladder | None = None,
    step_s: float = 10.0,
    mlserver_venv: Path = MLSERVER_VENV,
    log: Log = print,
) -> Path:
    """The scorer against MLServer on the same LightGBM model, ghz ModelInfer, same requests."""
    ladder = ladder or Ladder(SCORER_RATES, 10.0)
    work = out_dir / ".bench-scorer.tmp"
    model_root = var_dir / "models"
    live = ModelLifecycle(model_root).read().routing.live
    metadata, model_dir = repository.load(model_root, repository.DEFAULT_MODEL_NAME, live)
    population = data.sample_population(var_dir / "data", 2000)
    vectors = data.model_vectors(population, var_dir / "data", metadata)
    # No outputs named: each server returns its default outputs (ours: label and
    # probabilities; MLServer's LightGBM runtime: "predict").
    requests = data.infer_requests(vectors, metadata.name, metadata.version, metadata.input_name)
    file = data.write_data_file(work / "infer.json", requests)
    sides: list[Side] = []
    names: dict[str, Sequence[str]] = {}

    port = free_port()
    ours = Process(
        "scorer",
        [sys.executable, "-m", "services.scorer"],
        ready=lambda: grpc_serving(f"127.0.0.1:{port}"),
        env={"FRAUD_SCORER_PORT": str(port), "FRAUD_SCORER_VAR_DIR": str(var_dir)},
        log_path=work / "scorer.log",
    )
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    repo = mlserver_repo(work / "mlserver", model_dir, metadata, ports)
    theirs = Process(
        "mlserver",
        [str(_mlserver_binary(mlserver_venv)), "start", str(repo)],
        ready=lambda: http_ok(f"http://127.0.0.1:{ports['http']}/v2/models/{metadata.name}/ready"),
        # One inference thread, as the scorer's ONNX Runtime session has.
        env={"OMP_NUM_THREADS": "1"},
        log_path=work / "mlserver.log",
    )
    for label, process, target in (
        ("fraudmesh scorer (ONNX Runtime)", ours, f"127.0.0.1:{port}"),
        ("MLServer 1.7 (LightGBM runtime)", theirs, f"127.0.0.1:{ports['grpc']}"),
    ):
        log(f"scorer: {label} …")
        process.start()
        try:
            process.wait_ready(120)
            pids = {process.name: process.pid or 0}
            normal_priority(list(pids.values()))
            side = _ghz_side(
                label, ladder, ghz.MODEL_INFER, target, lambda: file, step_s=step_s,
                timeout_ms=1000.0, pids=pids, collapsed=_loose, dead=_exited(process), log=log,
            )  # fmt: skip
        finally:
            process.stop()
        sides.append(side)
        names[label] = list(pids)

    ours_r, theirs_r = sides[0].results, sides[1].results
    best_ours = sides[0].best()
    rate_ratio = _ratio(_rate(sides[0]), _rate(sides[1]))
    o500, t500 = report.at_rate(ours_r, 500), report.at_rate(theirs_r, 500)
    p99_ratio = _ratio(o500.p99_ms if o500 else None, t500.p99_ms if t500 else None)
    verdicts = [
        "highest rate with p99 ≤ 10 ms, 0 errors and ≥ 95 % answered: "
        f"{_best('scorer', sides[0])}, {_best('MLServer', sides[1])}, ratio "
        + (
            f"{rate_ratio:.1f}×{_bound_note(sides[0], sides[1])} (target ≥ 3×: "
            f"{'met' if rate_ratio >= 3 else 'missed'})"
            if rate_ratio is not None
            else "unbounded (target ≥ 3×: met)"
            if best_ours is not None
            else "n/a (target ≥ 3×: missed)"
        ),
        f"p99 at 500 rps: scorer {_fmt(o500.p99_ms if o500 else None, ' ms')}, MLServer "
        f"{_fmt(t500.p99_ms if t500 else None, ' ms')}, ratio {_fmt(p99_ratio, '×')} "
        f"(target ≤ 0.5×: {'met' if p99_ratio is not None and p99_ratio <= 0.5 else 'missed'})",
    ]
    intro = (
        f"ghz ModelInfer open loop, {step_s:g} s per step, 1 s deadline, the same 2,000 "
        f"requests for both (one FP32 [1, {len(metadata.feature_order)}] row each as "
        "raw_input_contents, the vectors the gateway builds for the load-test mix; no "
        "outputs named). Same model version: model.onnx for the scorer, lightgbm.txt (the "
        "booster it was exported from) for MLServer. MLServer 1.7.1 with mlserver-lightgbm "
        "1.7.1 in its own virtual environment, default settings (parallel_workers 1: "
        "inference in one worker process), OMP_NUM_THREADS=1; its RSS is the sum of its "
        "process tree."
    )
    md = _write(out_dir, "scorer", "Scorer vs MLServer", intro, sides, verdicts, 10.0, names)
    shutil.rmtree(work, ignore_errors=True)
    return md


def known_entities(data_dir: Path) -> dict[str, str]:
    """Card, merchant and terminal of the latest genuine payment in the dataset: entities
    the online store holds rows for, in every view the feature service reads."""
    tx = pd.read_parquet(
        data_dir / layout.TRANSACTIONS_FILE,
        columns=["timestamp", "card_id", "merchant_id", "terminal_id", "is_fraud"],
    )
    genuine = tx[~tx["is_fraud"] & tx["terminal_id"].fillna("").astype(bool)]
    if genuine.empty:
        raise ValueError(f"{data_dir}: no genuine payment with a terminal to read features for")
    row = genuine.sort_values("timestamp", kind="stable").iloc[-1]
    return {k: str(row[k]) for k in ("card_id", "merchant_id", "terminal_id")}


def feast_request(entities: dict[str, str]) -> bytes:
    """The JSON body of feast serve's POST /get-online-features for one set of entities.

    Feast answers HTTP 500 (a KeyError) when a join key of any view in the feature service
    is absent, so every entity of the service is named, the terminal included.
    """
    return json.dumps(
        {
            "feature_service": definitions.FEATURE_SERVICE,
            "entities": {key: [value] for key, value in entities.items()},
        }
    ).encode()


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_feature_service(target: str, entities: dict[str, str], log_path: Path) -> None:
    """Fails unless the feature service finds every feature of ``entities``: a side that
    reads nothing must not pass for a fast one."""
    import grpc

    from fraud.v1 import features_pb2, features_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = features_pb2_grpc.FeatureServiceStub(channel).GetFeatures(
                features_pb2.GetFeaturesRequest(
                    card_id=entities["card_id"],
                    merchant_id=entities["merchant_id"],
                    terminal_id=entities["terminal_id"],
                ),
                timeout=10,
            )
        except grpc.RpcError as error:
            raise RuntimeError(
                f"the feature service answered {error}; its log ends:\n{_log_tail(log_path)}"
            ) from error
    missing = [f.name for f in reply.features if f.status != features_pb2.FEATURE_STATUS_PRESENT]
    if missing or not reply.features:
        raise RuntimeError(f"the feature service lacks {missing or 'every feature'} of {entities}")


def check_feast_serve(url: str, body: bytes, log_path: Path) -> None:
    """Fails with feast serve's answer and log unless it answers 200 with every feature
    found: fortio would count a set-up error as the peer's errors."""
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = json.loads(reply.read())
    except urllib.error.HTTPError as error:
        raise RuntimeError(
            f"feast serve answered HTTP {error.code} to {body.decode()}: "
            f"{error.read()[:500].decode(errors='replace')}; its log ends:\n"
            f"{_log_tail(log_path)}"
        ) from error
    names = answer.get("metadata", {}).get("feature_names", [])
    results = answer.get("results", [])
    missing = [
        name
        for name, result in zip(names, results, strict=False)
        if (result.get("statuses") or ["NOT_FOUND"])[0] != "PRESENT"
    ]
    if missing or len(results) < len(featurespec.STORE_FEATURES):
        raise RuntimeError(f"feast serve lacks {missing or 'features'} of {body.decode()}")


def bench_features(
    var_dir: Path,
    out_dir: Path,
    *,
    ladder: Ladder | None = None,
    step_s: float = 10.0,
    log: Log = print,
) -> Path:
    """The feature service against ``feast serve`` on the same Redis, same entity, same rates."""
    ladder = ladder or Ladder(FEATURE_RATES, 10.0)
    work = out_dir / ".bench-features.tmp"
    feast = Path(sys.executable).parent / "feast"
    redis_port = free_port()
    redis = Process(
        "redis",
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        ready=lambda: tcp_open("127.0.0.1", redis_port),
        log_path=work / "redis.log",
    )  # fmt: skip
    connection = f"127.0.0.1:{redis_port}"
    sides: list[Side] = []
    names: dict[str, Sequence[str]] = {}
    redis.start()
    try:
        redis.wait_ready(30)
        normal_priority([redis.pid or 0])
        log("features: materializing into redis …")
        store_admin.materialize(
            FeatureStoreSettings(var_dir=var_dir, store="redis", redis_connection=connection)
        )
        # feast serve reads feature_store.yaml from a repo folder: a separate one here, so
        # the data folder's own file (the SQLite store) is left alone.
        serve_settings = FeatureStoreSettings(
            var_dir=var_dir,
            store="redis",
            redis_connection=connection,
            data_dir=work / "feast-repo",
        )
        repo = store_admin.write_feature_store_yaml(serve_settings).parent
        entities = known_entities(var_dir / "data")
        grpc_file = data.write_data_file(work / "features.json", [entities])
        body = feast_request(entities)

        port = free_port()
        ours = Process(
            "features",
            [sys.executable, "-m", "services.features"],
            ready=lambda: grpc_serving(f"127.0.0.1:{port}"),
            env={
                "FRAUD_FEATURES_PORT": str(port),
                "FRAUD_FEATURES_VAR_DIR": str(var_dir),
                "FRAUD_FEATURES_STORE": "redis",
                "FRAUD_FEATURES_REDIS_CONNECTION": connection,
            },
            log_path=work / "features.log",
        )
        label = "fraudmesh features (gRPC, ghz)"
        log(f"features: {label} …")
        ours.start()
        try:
            ours.wait_ready(120)
            check_feature_service(f"127.0.0.1:{port}", entities, work / "features.log")
            pids = {"features": ours.pid or 0, "redis": redis.pid or 0}
            normal_priority(list(pids.values()))
            side = _ghz_side(
                label, ladder, ghz.GET_FEATURES, f"127.0.0.1:{port}", lambda: grpc_file,
                step_s=step_s, timeout_ms=1000.0, pids=pids, collapsed=_loose,
                dead=lambda: [] if ours.alive() and redis.alive() else ["features or redis"],
                log=log,
            )  # fmt: skip
        finally:
            ours.stop()
        sides.append(side)
        names[label] = list(pids)

        http_port = free_port()
        theirs = Process(
            "feast-serve",
            [str(feast), "-c", str(repo), "serve", "-h", "127.0.0.1", "-p", str(http_port),
             "--no-access-log", "--workers", "1", "--max-requests", "0"],
            ready=lambda: http_ok(f"http://127.0.0.1:{http_port}/health"),
            log_path=work / "feast-serve.log",
        )  # fmt: skip
        label = "feast serve (HTTP, fortio)"
        log(f"features: {label} …")
        theirs.start()
        try:
            theirs.wait_ready(120)
            pids = {"feast-serve": theirs.pid or 0, "redis": redis.pid or 0}
            normal_priority(list(pids.values()))
            url = f"http://127.0.0.1:{http_port}/get-online-features"
            check_feast_serve(url, body, work / "feast-serve.log")

            def run(rates: Sequence[int], warm: bool) -> list[report.Step]:
                return _fortio_schedule(
                    url, body, rates, step_s, pids, log, warm=warm,
                    dead=lambda: [] if theirs.alive() and redis.alive() else ["feast or redis"],
                )  # fmt: skip

            steps, stop = climb(ladder, run, _loose, step_s=step_s, log=log)
            log(f"{label}: the ladder stopped: {stop}")
        finally:
            theirs.stop()
        sides.append(Side(label, steps, ladder, stop))
        names[label] = list(pids)
    finally:
        redis.stop()

    ours_r, theirs_r = sides[0].results, sides[1].results
    o300, t300 = report.at_rate(ours_r, 300), report.at_rate(theirs_r, 300)
    ratio = _ratio(o300.p99_ms if o300 else None, t300.p99_ms if t300 else None)
    rate_ratio = _ratio(_rate(sides[0]), _rate(sides[1]))
    verdicts = [
        f"p99 at 300 rps: feature service {_fmt(o300.p99_ms if o300 else None, ' ms')}, feast "
        f"serve {_fmt(t300.p99_ms if t300 else None, ' ms')}, ratio {_fmt(ratio, '×')} "
        f"(target ≤ 0.33×: {'met' if ratio is not None and ratio <= 1 / 3 else 'missed'})",
        "highest rate with p99 ≤ 10 ms, 0 errors and ≥ 95 % answered: "
        f"{_best('feature service', sides[0])}, {_best('feast serve', sides[1])}, ratio "
        f"{_fmt(rate_ratio, '×')}{_bound_note(sides[0], sides[1])}",
    ]
    intro = (
        f"{step_s:g} s per step, one Redis (materialized once from the same data and "
        "registry), both asked for the same known card, merchant and terminal (the "
        f"{len(featurespec.STORE_FEATURES)} features of the {definitions.FEATURE_SERVICE} "
        "feature service; each side checked to find them all before its steps). The "
        "feature service: gRPC "
        "GetFeatures driven by ghz open loop. feast serve (Feast "
        f"{_feast_version()}, HTTP POST /get-online-features, one gunicorn/uvicorn worker, "
        "no access log, no periodic worker recycling) driven by fortio 1.66 "
        "(`go install fortio.org/fortio@v1.66.5`), uniform pacing over many keep-alive "
        "connections; its RSS is the sum of the gunicorn master and worker."
    )
    md = _write(
        out_dir, "features", "Feature service vs feast serve", intro, sides, verdicts, 10.0, names
    )
    shutil.rmtree(work, ignore_errors=True)
    return md


def _feast_version() -> str:
    import feast

    return str(feast.__version__)


def _fortio_schedule(
    url: str,
    body: bytes,
    rates: Sequence[int],
    step_s: float,
    pids: dict[str, int],
    log: Log,
    *,
    warm: bool = True,
    dead: Callable[[], Sequence[str]] = tuple,
) -> list[report.Step]:
    from loadtest.rss import RssSampler

    if warm and rates:
        fortio.run_fortio(url, body, rps=rates[0], duration_s=3.0)
    steps: list[report.Step] = []
    bad = 0
    with RssSampler(pids) as sampler:
        for rps in rates:
            sampler.reset()
            cpu_before = sampler.cpu_seconds()
            result = fortio.run_fortio(url, body, rps=rps, duration_s=step_s)
            cpu_after = sampler.cpu_seconds()
            sampler.sample()
            gone = dead()
            if gone:
                raise RuntimeError(f"exited during the {rps} rps step: {', '.join(gone)}")
            cpu = {
                n: (cpu_after[n] - cpu_before.get(n, 0.0)) * 1000 / max(result.count, 1)
                for n in cpu_after
            }
            steps.append(report.Step(result, sampler.reset(), cpu))
            log(
                f"{rps:>5} rps: achieved {result.achieved_rps:.0f}, p50 {result.p50_ms:.2f} ms, "
                f"p99 {result.p99_ms:.2f} ms, errors {result.error_share:.2%}"
            )
            bad = bad + 1 if _loose(result) else 0
            if bad >= 2:
                break
    return steps


BENCHES = ("floor", "scorer", "features")
LISTED_RATES = {"floor": FLOOR_RATES, "scorer": SCORER_RATES, "features": FEATURE_RATES}
"""Each benchmark's listed rates; its ladder goes on past them."""
LIMITS_MS = {"floor": report.BUDGET_MS, "scorer": 10.0, "features": 10.0}
"""The p99 each benchmark's sides are judged by (with 0 errors, ≥ 95 % answered)."""


def _rates(text: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give rates as 100,200,400") from None
    if not rates or any(r <= 0 for r in rates) or list(rates) != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"{text!r}: give increasing positive rates")
    return rates


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadtest.bench``: runs the side-by-side benchmarks."""
    parser = argparse.ArgumentParser(description="fraudmesh side-by-side benchmarks")
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=runner.RESULTS_DIR)
    parser.add_argument("--only", default=",".join(BENCHES), help="floor,scorer,features")
    parser.add_argument("--step-seconds", type=_positive(float), default=10.0)
    parser.add_argument(
        "--rates",
        type=_rates,
        default=None,
        help="listed rates for every benchmark instead of each one's own (the ladder goes "
        "on past them until a side misses its criterion)",
    )
    parser.add_argument(
        "--max-rps",
        type=_positive(int),
        default=MAX_RPS,
        help=f"no ladder offers more than this (default {MAX_RPS})",
    )
    parser.add_argument(
        "--max-side-seconds",
        type=_positive(float),
        default=MAX_SIDE_S,
        help="a ladder climbs past its listed rates only while its side's steps have taken "
        f"less than this (default {MAX_SIDE_S:g})",
    )
    parser.add_argument("--mlserver-venv", type=Path, default=MLSERVER_VENV)
    args = parser.parse_args(argv)
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        parser.error(f"unknown bench {sorted(unknown)}; choose from {BENCHES}")
    runner.check_state(args.var_dir)
    ghz.find_ghz()
    for name in chosen:
        started = time.monotonic()
        ladder = Ladder(
            args.rates or LISTED_RATES[name],
            LIMITS_MS[name],
            max_rps=int(args.max_rps),
            max_s=args.max_side_seconds,
        )
        if name == "floor":
            md = bench_floor(args.var_dir, args.out, ladder=ladder, step_s=args.step_seconds)
        elif name == "scorer":
            md = bench_scorer(
                args.var_dir,
                args.out,
                ladder=ladder,
                step_s=args.step_seconds,
                mlserver_venv=args.mlserver_venv,
            )
        else:
            md = bench_features(args.var_dir, args.out, ladder=ladder, step_s=args.step_seconds)
        print(f"{name}: {md} ({time.monotonic() - started:.0f} s)")
        print(md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
