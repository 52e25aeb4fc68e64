"""What starting a mesh costs: this checkout against another, in turns.

A mesh start is CPU-bound on a small machine: each Python service imports its libraries
(Feast, ONNX Runtime, Arrow) and warms up before it answers, and the test suite starts
dozens of meshes a run. Each round starts the services of ``fraudmesh up`` on two cores (two
gateways reading the store and running the model in process, one of every other service;
not the observability stack, whose programs are not Python) on
``--var-dir`` from this checkout and from ``--before`` (another checkout, its own folder
first on the path, run with this virtual environment or with ``--before-python``'s), in
alternating order, and records the time until every process is ready, each process's CPU
time (user + system) by then, and whether each side found its modules' bytecode compiled
(where ``PYTHONDONTWRITEBYTECODE`` is set, nothing compiles it after the install).

Run with ``python -m loadtest.start_bench --before ../earlier-checkout --var-dir var``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtest import provenance

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "mesh-start"

PROBE = """
import importlib.util, json, os, sys, tempfile, time
from pathlib import Path
import feast, psutil, services.mesh
compiled = {
    name: os.path.exists(importlib.util.cache_from_source(module.__file__))
    for name, module in (("project", services.mesh), ("feast", feast))
}
from services.mesh import Mesh, MeshConfig
config = MeshConfig.on_free_ports(
    var_dir=Path(sys.argv[1]), log_dir=Path(tempfile.mkdtemp()),
    gateway_replicas=2, gateway_in_process=True,
)
mesh = Mesh(config)
started = time.monotonic()
mesh.start(timeout_s=180)
ready_s = time.monotonic() - started
cpu = {}
try:
    for name, process in mesh.processes.items():
        times = psutil.Process(process.pid).cpu_times()
        cpu[name] = times.user + times.system + times.children_user + times.children_system
finally:
    mesh.stop()
print(json.dumps({"ready_s": ready_s, "cpu_s": cpu, "bytecode": compiled}))
"""
"""Runs in the checkout measured: only the mesh API both sides have."""


def _start(checkout: Path, var_dir: Path, python: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, "-c", PROBE, str(var_dir)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"a mesh start in {checkout} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(
    before: Path, after: Path, var_dir: Path, rounds: int, before_python: str = sys.executable
) -> dict[str, Any]:
    """Each side's starts, alternating which goes first."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for r in range(rounds):
        order = [("before", before, before_python), ("after", after, sys.executable)]
        for side, checkout, python in order if r % 2 == 0 else order[::-1]:
            runs[side].append(_start(checkout, var_dir, python))
    summary: dict[str, Any] = {}
    for side, starts in runs.items():
        totals = [sum(s["cpu_s"].values()) for s in starts]
        names = sorted({n for s in starts for n in s["cpu_s"]})
        summary[side] = {
            "cpu_s_median": round(statistics.median(totals), 2),
            "ready_s_median": round(statistics.median(s["ready_s"] for s in starts), 2),
            "bytecode": starts[0].get("bytecode", {}),
            "cpu_s_by_process_median": {
                n: round(statistics.median(s["cpu_s"].get(n, 0.0) for s in starts), 2)
                for n in names
            },
        }
    ratios = [
        sum(a["cpu_s"].values()) / sum(b["cpu_s"].values())
        for a, b in zip(runs["after"], runs["before"], strict=True)
    ]
    return {
        "rounds": rounds,
        "before": provenance.git_commit(before),
        "runs": runs,
        "summary": summary,
        "cpu_ratio_median": round(statistics.median(ratios), 3),
        "cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def _markdown(result: dict[str, Any]) -> str:
    before, after = result["summary"]["before"], result["summary"]["after"]
    low, high = result["cpu_ratio_range"]
    names = sorted(set(before["cpu_s_by_process_median"]) | set(after["cpu_s_by_process_median"]))
    lines = [
        "# A mesh start: this checkout against another",
        "",
        f"Before: commit {result['before']}. {result['rounds']} rounds, sides alternating; the "
        "services of `fraudmesh up` on two cores (two gateways in process, one of every other "
        "service, no observability stack); medians of the rounds.",
        "",
        "| | CPU s until ready | ready after s |",
        "|---|---:|---:|",
        f"| before | {before['cpu_s_median']:.2f} | {before['ready_s_median']:.2f} |",
        f"| after | {after['cpu_s_median']:.2f} | {after['ready_s_median']:.2f} |",
        "",
        f"Bytecode compiled before the start: before {_bytecode(before)}; after "
        f"{_bytecode(after)}.",
        "",
        f"CPU ratio (median of the rounds' ratios): {result['cpu_ratio_median']:.2f}× "
        f"({low:.2f}–{high:.2f}).",
        "",
        "| process | CPU s before | CPU s after |",
        "|---|---:|---:|",
    ]
    for name in names:
        lines.append(
            f"| {name} | {before['cpu_s_by_process_median'].get(name, 0.0):.2f} "
            f"| {after['cpu_s_by_process_median'].get(name, 0.0):.2f} |"
        )
    return "\n".join(lines) + "\n"


def _bytecode(side: dict[str, Any]) -> str:
    found = side.get("bytecode", {})
    return ", ".join(f"{name} {'yes' if yes else 'no'}" for name, yes in found.items()) or "?"


def _command(before: Path, before_python: str | None) -> str:
    """This run's command, the other checkout named by its commit and the other Python by
    what it is, not by where they were on the machine that ran it."""
    named = {str(before): provenance.other_checkout(before)}
    if before_python is not None:
        named[before_python] = "<python of another environment>"
    return provenance.naming_checkouts(provenance.command_line(), named)


def main(argv: list[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout")
    parser.add_argument("--var-dir", type=Path, required=True, help="prepared state (make data)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default=STEM, help="results file stem under loadtest/results")
    parser.add_argument(
        "--before-python",
        help="the Python of the environment to run --before with (default: this one), e.g. "
        "one installed without compiling bytecode",
    )
    args = parser.parse_args(argv)
    after = Path(__file__).resolve().parent.parent
    python = args.before_python or sys.executable
    result = measure(args.before.resolve(), after, args.var_dir.resolve(), args.rounds, python)
    text = _markdown(result)
    command = _command(args.before, args.before_python)
    paths = provenance.write(RESULTS / args.name, result, text, provenance.record(command))
    print(text)
    print("written:", *paths)


if __name__ == "__main__":
    main()
