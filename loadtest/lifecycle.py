"""Model lifecycle benchmark: shadow scoring's cost, and transitions under load.

``python -m loadtest.lifecycle [--var-dir var]`` starts a mesh (two gateway replicas,
Envoy) on a private copy of the published models, and drives ``Score`` through Envoy with
ghz, open loop, each call with the 42 ms deadline:

1. **Shadow on vs off** at ``--shadow-rps`` (200): alternating runs with no shadow and
   with a shadow version (a copy of the live model) scoring every answer after it is sent.
   Reports each run's p99 and the median p99 of each side.
2. **Transitions** at ``--transitions-rps`` (300), one run: a candidate is published
   (must not answer), canaried at 20 %, promoted, rolled back, then a candidate that
   declines everything is canaried and must be rolled back automatically. Reports per
   phase the calls, their statuses (late = DEADLINE_EXCEEDED), p99, and the answers by
   model version and by the rules (from the gateways' metrics).

Results go to ``loadtest/results/lifecycle.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from loadtest import data, ghz, provenance
from loadtest.runner import RESULTS_DIR, start_mesh
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.domain import metrics
from services.mesh import Mesh
from services.models import repository
from services.models.lifecycle import ModelLifecycle, VersionState

BUDGET_MS = 42.0


def publish_copy(lifecycle: ModelLifecycle, base: str, **changes: Any) -> str:
    """Publishes ``base``'s ONNX model (metadata changed by ``changes``) as a candidate."""
    metadata, folder = repository.load(lifecycle.model_root, lifecycle.name, base)
    published, _, _ = lifecycle.publish_candidate(
        metadata.model_copy(update=changes),
        {repository.MODEL_FILE: folder / repository.MODEL_FILE},
        by="lifecycle-benchmark",
    )
    return published.version


def _gateway_pages(mesh: Mesh) -> list[scrape.Samples]:
    """The /metrics of every gateway of the mesh, now."""
    return [
        scrape.fetch(scrape.url(mesh.config.host, port), timeout_s=2)
        for name, port in mesh.config.metrics_ports.items()
        if name.startswith("gateway")
    ]


def answers(mesh: Mesh) -> dict[str, float]:
    """Answers so far, summed over the gateways: ``model:<route>:<version>`` and ``rules``."""
    total: dict[str, float] = {}
    for page in _gateway_pages(mesh):
        for s in page.matching(catalogue.MODEL_ANSWERS):
            key = f"model:{s.labels['route']}:{s.labels['model_version']}"
            total[key] = total.get(key, 0.0) + s.value
        rules = page.get(catalogue.DECISIONS, scored_by="rules")
        if rules is not None:
            total["rules"] = total.get("rules", 0.0) + rules
    return total


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {
        k: round(v - before.get(k, 0.0)) for k, v in sorted(after.items()) if v > before.get(k, 0)
    }


@dataclass
class Phase:
    """One stretch of the transitions run."""

    name: str
    start: float
    """Wall-clock seconds (epoch) when it began."""
    end: float = 0.0
    answers: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    p99_ms: float = 0.0
    max_ms: float = 0.0


def _per_phase(report: dict[str, Any], phases: list[Phase]) -> None:
    """Fills each phase's calls, statuses and latencies from ghz's per-call details."""
    for phase in phases:
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        for d in report.get("details") or []:
            sent = datetime.fromisoformat(d["timestamp"].replace("Z", "+00:00")).timestamp()
            if phase.start <= sent < phase.end:
                latencies.append(d["latency"] / 1e6)
                status = d.get("status") or "OK"
                statuses[status] = statuses.get(status, 0) + 1
        latencies.sort()
        phase.calls = len(latencies)
        phase.statuses = statuses
        phase.p99_ms = metrics.percentile(latencies, 99, empty=0.0)
        phase.max_ms = latencies[-1] if latencies else 0.0


def _ghz(target: str, data_file: Path, rps: int, duration_s: float) -> dict[str, Any]:
    argv = ghz.ghz_command(
        ghz.SCORE,
        target,
        data_file,
        rps=rps,
        duration_s=duration_s,
        timeout_ms=BUDGET_MS,
    )
    completed = subprocess.run(
        argv, capture_output=True, timeout=duration_s + 120, check=False, cwd=ghz.REPO_ROOT
    )
    if completed.returncode != 0 or not completed.stdout.strip():
        raise RuntimeError(f"ghz failed: {completed.stderr.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


def shadow_cost(
    mesh: Mesh,
    lifecycle: ModelLifecycle,
    data_file: Path,
    rps: int,
    run_s: float,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """p99 with and without a shadow version, in alternating runs."""
    live = lifecycle.read().routing.live
    assert live is not None
    runs: dict[str, list[ghz.Result]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    shadowed: list[dict[str, int]] = []
    for i in range(rounds):
        for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
            shadow = None
            if side == "on":
                shadow = publish_copy(lifecycle, live)
                lifecycle.shadow(shadow, by="lifecycle-benchmark")
                time.sleep(2)  # loaded, warmed and routed everywhere
            before = _shadow_counts(mesh)
            cpu_before = _cpu_s(mesh)
            result = ghz.parse_report(_ghz(mesh.config.envoy_target, data_file, rps, run_s), rps)
            runs[side].append(result)
            cpu[side].append(1000 * (_cpu_s(mesh) - cpu_before) / max(result.count, 1))
            if shadow is not None:
                shadowed.append(_delta(_shadow_counts(mesh), before))
                lifecycle.retire(shadow, by="lifecycle-benchmark")
                time.sleep(1)
            log(
                f"shadow {side:3}: p99 {result.p99_ms:.2f} ms, p99.9 {result.p999_ms:.2f} ms, "
                f"CPU {cpu[side][-1]:.2f} ms per call, "
                f"{result.count} calls, {dict(result.status_counts)}"
            )
    median = {side: statistics.median(r.p99_ms for r in rs) for side, rs in runs.items()}
    cpu_median = {side: statistics.median(values) for side, values in cpu.items()}
    return {
        "cpu_ms_per_call": cpu,
        "median_cpu_ms_per_call": cpu_median,
        "rps": rps,
        "run_s": run_s,
        "runs": {side: [r.to_dict() for r in rs] for side, rs in runs.items()},
        "median_p99_ms": median,
        "added_p99_ms": median["on"] - median["off"],
        "shadow_counts": shadowed,
    }


def _cpu_s(mesh: Mesh) -> float:
    """CPU seconds the mesh's processes (Envoy, gateways, features, scorer) have used."""
    total = 0.0
    for process in mesh.processes.values():
        if process.pid is None:
            continue
        try:
            times = psutil.Process(process.pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _shadow_counts(mesh: Mesh) -> dict[str, float]:
    total: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        total[key] = total.get(key, 0.0) + value

    for page in _gateway_pages(mesh):
        for s in page.matching(catalogue.SHADOW_DECISIONS):
            add("agreed" if s.labels["answer"] == s.labels["shadow"] else "disagreed", s.value)
        for spec, key in (
            (catalogue.SHADOW_DROPPED, "dropped"),
            (catalogue.SHADOW_ERRORS, "errors"),
        ):
            found = page.get(spec)
            if found is not None:
                add(key, found)
    return total


def transitions(
    mesh: Mesh,
    lifecycle: ModelLifecycle,
    data_file: Path,
    rps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One ghz run at ``rps`` while the lifecycle changes on a schedule."""
    live = lifecycle.read().routing.live
    assert live is not None
    phases: list[Phase] = []
    notes: dict[str, Any] = {}

    def begin(name: str) -> None:
        now = time.time()
        if phases:
            phases[-1].end = now
            phases[-1].answers = _delta(answers(mesh), counts[-1])
        counts.append(answers(mesh))
        phases.append(Phase(name, now))

    counts: list[dict[str, float]] = []
    schedule_error: list[BaseException] = []

    def schedule() -> None:
        try:
            begin(f"steady, v{live} live")
            time.sleep(5)
            new = publish_copy(lifecycle, live)
            notes["candidate"] = new
            begin(f"v{new} published (candidate)")
            time.sleep(5)
            lifecycle.canary(new, 20, by="lifecycle-benchmark")
            begin(f"v{new} canary 20%")
            time.sleep(10)
            lifecycle.promote(new, by="lifecycle-benchmark")
            begin(f"v{new} promoted")
            time.sleep(8)
            lifecycle.rollback(by="lifecycle-benchmark", reason="benchmark")
            begin(f"rolled back to v{live}")
            time.sleep(8)
            bad = publish_copy(
                lifecycle, live, thresholds=repository.Thresholds(review=0.0, decline=0.0)
            )
            lifecycle.canary(bad, 20, by="lifecycle-benchmark")
            started = time.monotonic()
            begin(f"v{bad} (declines all) canary 20%")
            while lifecycle.read().versions[bad].state is not VersionState.RETIRED:
                if time.monotonic() - started > 30:
                    raise RuntimeError("the bad canary was not rolled back within 30 s")
                time.sleep(0.05)
            notes["bad_canary_rolled_back_after_s"] = round(time.monotonic() - started, 2)
            notes["bad_canary_reason"] = lifecycle.read().versions[bad].reason
            begin(f"v{bad} rolled back automatically")
            time.sleep(4)
            phases[-1].end = time.time()
            phases[-1].answers = _delta(answers(mesh), counts[-1])
        except BaseException as error:
            schedule_error.append(error)

    duration = 5 + 5 + 10 + 8 + 8 + 6 + 4 + 4
    thread = threading.Thread(target=schedule)
    time.sleep(0.5)
    thread.start()
    report = _ghz(mesh.config.envoy_target, data_file, rps, duration)
    thread.join(timeout=120)
    if schedule_error:
        raise RuntimeError("transition schedule failed") from schedule_error[0]
    _per_phase(report, phases)
    total = ghz.parse_report(report, rps)
    for phase in phases:
        log(
            f"{phase.name:40} {phase.calls:5} calls {phase.statuses} "
            f"p99 {phase.p99_ms:.2f} ms, answers {phase.answers}"
        )
    return {
        "rps": rps,
        "total": total.to_dict(),
        "phases": [phase.__dict__ for phase in phases],
        **notes,
    }


def markdown(shadow: dict[str, Any], moves: dict[str, Any], command: str) -> str:
    """The report."""
    lines = [
        "# Model lifecycle under load",
        "",
        f"`{command}` — ghz open loop through Envoy, 42 ms deadline per call, two gateway "
        f"replicas; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on a shared 2-core machine.",
        "",
        f"## Shadow scoring at {shadow['rps']} rps ({shadow['run_s']:g} s per run)",
        "",
        "| run | shadow | calls | not OK | p50 ms | p99 ms | p99.9 ms | mesh CPU ms per call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in ("off", "on"):
        for i, run in enumerate(shadow["runs"][side], 1):
            errors = run["count"] - run["status_counts"].get("OK", 0)
            lines.append(
                f"| {i} | {side} | {run['count']} | {errors} | {run['p50_ms']:.2f} | "
                f"{run['p99_ms']:.2f} | {run['p999_ms']:.2f} | "
                f"{shadow['cpu_ms_per_call'][side][i - 1]:.2f} |"
            )
    m = shadow["median_p99_ms"]
    c = shadow["median_cpu_ms_per_call"]
    lines += [
        "",
        f"Median p99: off {m['off']:.2f} ms, on {m['on']:.2f} ms: shadow adds "
        f"**{shadow['added_p99_ms']:+.2f} ms**. Median mesh CPU per call: off {c['off']:.2f} ms, "
        f"on {c['on']:.2f} ms. Shadow comparisons per run (agreed / disagreed decisions, "
        f"dropped, errors): {shadow['shadow_counts']}.",
        "",
        f"## Transitions at {moves['rps']} rps",
        "",
        "| phase | calls | statuses | p99 ms | max ms | answers (route:version, rules) |",
        "|---|---|---|---|---|---|",
    ]
    for p in moves["phases"]:
        lines.append(
            f"| {p['name']} | {p['calls']} | {p['statuses']} | {p['p99_ms']:.2f} | "
            f"{p['max_ms']:.2f} | {p['answers']} |"
        )
    t = moves["total"]
    lines += [
        "",
        f"Whole run: {t['count']} calls, {t['status_counts']}, p99 {t['p99_ms']:.2f} ms. "
        f"The declining canary was rolled back automatically after "
        f"{moves.get('bad_canary_rolled_back_after_s')} s: {moves.get('bad_canary_reason')}",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs both parts and writes the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--shadow-rps", type=int, default=200)
    parser.add_argument("--transitions-rps", type=int, default=300)
    parser.add_argument("--run-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--logs", type=Path, default=None, help="Keep the mesh's logs here.")
    parser.add_argument("--skip-shadow", action="store_true", help="Only the transitions.")
    args = parser.parse_args(argv)
    command = "python -m loadtest.lifecycle " + " ".join(argv or [])

    with tempfile.TemporaryDirectory(prefix="lifecycle-bench-") as tmp:
        work = Path(tmp)
        root = work / "models"
        shutil.copytree(args.var_dir / "models", root)
        lifecycle = ModelLifecycle(root)
        lifecycle.materialize(by="lifecycle-benchmark")
        env = {"FRAUD_GATEWAY_MODEL_ROOT": str(root), "FRAUD_SCORER_MODEL_ROOT": str(root)}
        mesh = start_mesh(
            args.var_dir, "sqlite", args.logs or work / "logs", extra_env=env, gateway_replicas=2
        )
        try:
            population = data.sample_population(args.var_dir / "data", 2000)
            data_file = data.write_data_file(
                work / "score.json", data.score_requests(population, "now")
            )
            # Warm the whole path before measuring.
            _ghz(mesh.config.envoy_target, data_file, args.shadow_rps, 5)
            shadow = (
                {}
                if args.skip_shadow
                else shadow_cost(
                    mesh, lifecycle, data_file, args.shadow_rps, args.run_s, args.rounds, print
                )
            )
            data_file = data.write_data_file(
                work / "score.json", data.score_requests(population, "now")
            )
            moves = transitions(mesh, lifecycle, data_file, args.transitions_rps, print)
        finally:
            mesh.stop()
    if not shadow:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    provenance.write(
        args.out / "lifecycle",
        {"shadow": shadow, "transitions": moves},
        markdown(shadow, moves, command.strip()),
        provenance.record(command.strip()),
    )
    print(f"wrote {args.out / 'lifecycle.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
