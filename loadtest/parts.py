"""What each process of a topology costs: CPU at idle, memory, and CPU per Score under load.

For each topology (processes per part, observability on as ``fraudmesh up`` runs it) and each
round, in an order that alternates round by round: a fresh mesh on a copy of the state
folder, ``--idle-seconds`` without traffic, then ``--rps`` calls/s through Envoy (ghz open
loop) for ``--seconds``. Every process's CPU time (its children's too) is read before and
after each phase. This is the evidence behind the sizes ``fraudmesh up`` chooses
(``services/mesh/sizing.py``): what a second feature service or scorer, Prometheus, the
monitor and the console cost.

Run with ``python -m loadtest.parts --topology two:2,2,2,2 --topology sized:1,2,1,1`` (envoy,
gateway, features, scorer); report: ``loadtest/results/parts.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from loadtest import data, ghz, provenance, runner

PARTS = ("envoy_replicas", "gateway_replicas", "features_replicas", "scorer_replicas")


def _topology(text: str) -> tuple[str, dict[str, int]]:
    """``NAME:E,G,F,S``: processes of Envoy, gateway, feature service and scorer."""
    name, _, counts = text.partition(":")
    try:
        values = [int(v) for v in counts.split(",")]
    except ValueError:
        values = []
    if not name or len(values) != len(PARTS) or not all(1 <= v <= 9 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME:E,G,F,S with counts 1-9")
    return name, dict(zip(PARTS, values, strict=True))


def _cpu(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds of each process and its children so far."""
    out = {}
    for name, p in procs.items():
        try:
            kids = p.children(recursive=True)
            out[name] = sum(p.cpu_times()[:2]) + sum(sum(k.cpu_times()[:2]) for k in kids)
        except psutil.Error:
            out[name] = float("nan")
    return out


def measure(
    source: Path, work: Path, name: str, replicas: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    """One topology: idle CPU (ms per second), RSS (MB) and CPU per Score (ms) per process."""
    state = runner.copy_state(source, work / "state")
    mesh = runner.start_mesh(
        state, "sqlite", work / "logs", replicas=replicas, observability=True, log=lambda _: None
    )
    try:
        procs = {n: psutil.Process(p.pid) for n, p in mesh.processes.items() if p.pid}
        time.sleep(10)  # start-up work (warm-up calls, first scrapes) settles
        c0 = _cpu(procs)
        time.sleep(args.idle_seconds)
        c1 = _cpu(procs)
        rss = {n: round(p.memory_info().rss / 2**20, 1) for n, p in procs.items()}
        population = data.sample_population(state / "data", 2000)
        requests = data.write_data_file(work / "score.json", data.score_requests(population, "now"))
        target = mesh.config.envoy_target
        ghz.run_ghz(ghz.SCORE, target, requests, rps=args.rps, duration_s=5, timeout_ms=42)
        c2 = _cpu(procs)
        result = ghz.run_ghz(
            ghz.SCORE, target, requests, rps=args.rps, duration_s=args.seconds, timeout_ms=42
        )
        c3 = _cpu(procs)
    finally:
        mesh.stop()
        shutil.rmtree(work, ignore_errors=True)
    count = max(result.count, 1)
    late = sum(1 for c in result.calls if c.status != "OK" or c.latency_ms > 42.0)
    return {
        "topology": name,
        "idle_ms_per_s": {n: round((c1[n] - c0[n]) / args.idle_seconds * 1000, 2) for n in procs},
        "rss_mb": rss,
        "cpu_ms_per_score": {n: round((c3[n] - c2[n]) / count * 1000, 3) for n in procs},
        "p99_ms": round(result.p99_ms, 2),
        "late_share": late / count,
    }


def _median_table(runs: Sequence[dict[str, Any]], name: str, key: str) -> dict[str, float]:
    """Per process, the median over the topology's rounds of ``key``."""
    mine = [r[key] for r in runs if r["topology"] == name]
    names = list(mine[0]) if mine else []
    return {n: statistics.median(m[n] for m in mine) for n in names}


def markdown(args: argparse.Namespace, runs: Sequence[dict[str, Any]]) -> str:
    """The report: per topology, per process, medians over the rounds."""
    out = [
        "# What each process costs, per topology",
        "",
        f"Observability on (as `fraudmesh up`), SQLite store; {args.idle_seconds:g} s idle, "
        f"then {args.rps} calls/s through Envoy for {args.seconds:g} s; {args.rounds} rounds "
        "alternating, medians. CPU of each process and its children.",
    ]
    names = list(dict.fromkeys(str(r["topology"]) for r in runs))
    for name in names:
        idle = _median_table(runs, name, "idle_ms_per_s")
        rss = _median_table(runs, name, "rss_mb")
        per = _median_table(runs, name, "cpu_ms_per_score")
        p99 = statistics.median(float(r["p99_ms"]) for r in runs if r["topology"] == name)
        out += [
            "",
            f"## {name}",
            "",
            "| process | idle CPU ms/s | RSS MB | CPU ms/Score |",
            "|---|---:|---:|---:|",
        ]
        out += [f"| {n} | {idle[n]:.1f} | {rss[n]:.0f} | {per[n]:.2f} |" for n in idle]
        out.append(
            f"| **total** | **{sum(idle.values()):.1f}** | **{sum(rss.values()):.0f}** | "
            f"**{sum(per.values()):.2f}** |"
        )
        out += ["", f"p99 at {args.rps} calls/s (median of rounds): {p99:.2f} ms"]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the rounds and writes the report."""
    parser = argparse.ArgumentParser(prog="python -m loadtest.parts")
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=runner.RESULTS_DIR)
    parser.add_argument("--topology", type=_topology, action="append", required=True)
    parser.add_argument("--rps", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    runner.check_state(args.var_dir)
    runs: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        order = args.topology if rnd % 2 else list(reversed(args.topology))
        for name, replicas in order:
            print(f"round {rnd}: {name} {replicas} …", flush=True)
            work = Path(tempfile.mkdtemp(prefix="parts-"))
            runs.append({"round": rnd, **measure(args.var_dir, work, name, replicas, args)})
    prov = provenance.record(" ".join(["python -m loadtest.parts", *sys.argv[1:]]))
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(args, runs)
    (args.out / "parts.md").write_text(provenance.markdown(text, prov))
    payload = {"provenance": prov.as_json(), "runs": runs}
    (args.out / "parts.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
