"""The monitor's cost: the mesh with the monitor and without it, side by side.

``python -m loadtest.monitor [--store sqlite] [--rates 400] [--rounds 4] [--run-s 20]``
starts two meshes at once on free ports, each on its own copy of the dataset, registry,
online store and model, both with the live loop (events, updater, decision sink):

- **monitor**: the monitor consumes the events (its own consumer group, niceness 10);
- **no-monitor**: ``monitor=False``: no monitor process, its group not declared.

ghz drives ``Score`` through each mesh's Envoy, open loop, 42 ms deadline per call, the same
2,000-request mix on both sides (unique transaction ids per run). Each round visits every
rate and runs both sides back to back, their order alternating, so that the shared machine's
drifts fall on both alike; figures are medians over the rounds.

Per run: p50 / p99 / p99.9 (errors included), errors, CPU ms per call of every process, and
for the monitor side the monitor's own CPU per decision: its CPU seconds from the start of
the run until it has consumed every decision of it, over those decisions (it may lag behind
the load at its lower priority and catch up after). The monitor is off the request path:
the serving processes' CPU per call and p99 should not move.

Results go to ``loadtest/results/monitor-<store>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from loadtest import data, ghz, provenance
from loadtest.liveloop import Side, measure, requests_file
from loadtest.runner import RESULTS_DIR, check_state, copy_state, machine_line, start_mesh
from services.common import metric_catalogue as catalogue
from services.common import scrape

SIDES = ("monitor", "no-monitor")
"""The mesh with the monitor, and without."""
CATCH_UP_S = 120.0
"""Longest wait for the monitor to consume a run's decisions after the run."""

Log = Callable[[str], None]


def _consumed(side: Side) -> float:
    url = side.metrics_url("monitor")
    if url is None or "monitor" not in side.procs:
        return 0.0
    return scrape.fetch(url).sum(catalogue.MONITOR_EVENTS, kind="decision")


def _monitor_cpu(side: Side) -> float:
    proc = side.procs.get("monitor")
    if proc is None:
        return 0.0
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def run_side(side: Side, idle: Side, rps: int, run_s: float, file: Path) -> dict[str, Any]:
    """One run of ``side``; for the monitor side, its CPU per decision through its catch-up."""
    consumed0, cpu0 = _consumed(side), _monitor_cpu(side)
    cell = measure(side, idle, rps, run_s, file)
    if side.name == "monitor":
        answered = round(cell["result"]["count"] * (1.0 - cell["result"]["error_share"]))
        deadline = time.monotonic() + CATCH_UP_S
        while _consumed(side) - consumed0 < answered and time.monotonic() < deadline:
            time.sleep(0.5)
        decisions = _consumed(side) - consumed0
        cpu = _monitor_cpu(side) - cpu0
        cell["monitor_decisions"] = decisions
        cell["monitor_cpu_ms_per_decision"] = cpu * 1000 / decisions if decisions else None
        cell["monitor_caught_up"] = decisions >= answered
    return cell


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: Sequence[dict[str, Any]], rates: Sequence[int]) -> list[dict[str, Any]]:
    """Per rate and side: medians of latency, serving CPU and the monitor's cost."""
    out = []
    for rps in rates:
        row: dict[str, Any] = {"rps": rps}
        for side in SIDES:
            mine = [r for r in runs if r["rps"] == rps and r["side"] == side]
            row[side] = {
                "runs": len(mine),
                "p50_ms": _median([r["result"]["p50_ms"] for r in mine]),
                "p99_ms": _median([r["result"]["p99_ms"] for r in mine]),
                "p999_ms": _median([r["result"]["p999_ms"] for r in mine]),
                "error_share": _median([r["result"]["error_share"] for r in mine]),
                "serving_ms_per_call": _median([r["serving_ms_per_call"] for r in mine]),
                "mesh_ms_per_call": _median([r["mesh_ms_per_call"] for r in mine]),
                "monitor_cpu_ms_per_decision": _median(
                    [
                        r["monitor_cpu_ms_per_decision"]
                        for r in mine
                        if r.get("monitor_cpu_ms_per_decision") is not None
                    ]
                ),
            }
        out.append(row)
    return out


def markdown(summary: Sequence[dict[str, Any]], command: str, store: str, run_s: float) -> str:
    """The side-by-side table."""
    lines = [
        f"# The monitor's cost ({store} store)",
        "",
        f"`{command}`; {machine_line()}; {run_s:g} s per run, medians over the rounds.",
        "",
        "| rps | side | p50 ms | p99 ms | p99.9 ms | errors | serving ms/call | mesh ms/call "
        "| monitor CPU ms/decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        for side in SIDES:
            s = row[side]
            per_decision = s["monitor_cpu_ms_per_decision"]
            lines.append(
                f"| {row['rps']} | {side} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                f"{s['p999_ms']:.2f} | {s['error_share']:.2%} | {s['serving_ms_per_call']:.3f} | "
                f"{s['mesh_ms_per_call']:.3f} | "
                + ("–" if side != "monitor" else f"{per_decision:.3f}")
                + " |"
            )
    lines += [
        "",
        "*Serving*: Envoy, gateway, feature service, scorer (and Redis). *Mesh*: every process "
        "(the monitor side includes the monitor). The monitor's CPU per decision counts its "
        "process from the start of a run until it consumed the run's decisions.",
    ]
    return "\n".join(lines) + "\n"


def run(
    var_dir: Path,
    store: str,
    rates: Sequence[int],
    rounds: int,
    run_s: float,
    warmup_s: float,
    log: Log = print,
) -> list[dict[str, Any]]:
    """Starts both meshes, runs the rounds, stops them; returns every run."""
    check_state(var_dir)
    population = data.sample_population(var_dir / "data", 2000)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="monitor-bench-") as tmp:
        meshes: dict[str, Side] = {}
        try:
            for name in SIDES:
                work = copy_state(var_dir, Path(tmp) / name)
                log(f"starting the mesh ({name}, {store} store) …")
                mesh = start_mesh(
                    work, store, work / "logs", monitor=name == "monitor", log=lambda _: None
                )
                meshes[name] = Side(name, mesh, work)
            for name, side in meshes.items():
                file = requests_file(side.work / "warmup.json", population, f"w{name}")
                ghz.run_ghz(ghz.SCORE, side.target, file, rps=rates[0],
                            duration_s=warmup_s, timeout_ms=42)  # fmt: skip
            turn = 0
            for rnd in range(1, rounds + 1):
                for rps in rates:
                    order = list(SIDES) if turn % 2 == 0 else list(reversed(SIDES))
                    turn += 1
                    for name in order:
                        side = meshes[name]
                        idle = meshes[SIDES[1] if name == SIDES[0] else SIDES[0]]
                        file = requests_file(
                            side.work / "score.json", population, f"r{rnd}-{rps}-{turn}-{name}"
                        )
                        cell = run_side(side, idle, rps, run_s, file)
                        cell["side"], cell["round"] = name, rnd
                        runs.append(cell)
                        res = cell["result"]
                        extra = (
                            f", monitor {cell['monitor_cpu_ms_per_decision']:.3f} ms/decision"
                            if cell.get("monitor_cpu_ms_per_decision") is not None
                            else ""
                        )
                        log(
                            f"round {rnd} {rps} rps {name:>10}: p99 {res['p99_ms']:.2f} ms, "
                            f"errors {res['error_share']:.2%}, serving "
                            f"{cell['serving_ms_per_call']:.3f} ms/call{extra}"
                        )
        finally:
            for side in meshes.values():
                side.mesh.stop()
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and writes ``monitor-<store>.md`` and ``.json``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--store", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--rates", default="400")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--run-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None, help="Base name; default monitor-<store>.")
    args = parser.parse_args(args_list)
    rates = [int(r) for r in args.rates.split(",") if r]
    command = " ".join(["python -m loadtest.monitor", *args_list])
    runs = run(args.var_dir, args.store, rates, args.rounds, args.run_s, args.warmup_s)
    summary = summarize(runs, rates)
    name = args.name or f"monitor-{args.store}"
    args.out.mkdir(parents=True, exist_ok=True)
    prov = provenance.record(command)
    text = markdown(summary, command, args.store, args.run_s)
    (args.out / f"{name}.md").write_text(provenance.markdown(text, prov))
    (args.out / f"{name}.json").write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "command": command,
                "finished": datetime.now(UTC).isoformat(),
                "machine": machine_line(),
                "store": args.store,
                "run_s": args.run_s,
                "runs": runs,
                "summary": summary,
            },
            indent=2,
        )
    )
    print(markdown(summary, command, args.store, args.run_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
