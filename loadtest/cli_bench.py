"""What a ``fraudmesh`` command costs before it does anything: this checkout against another.

Every command is a new Python process, and a process imports what the command line imports
before the command runs. Each command below is run in turns in this checkout and in
``--before`` (another checkout of the project, run with this virtual environment, its own
folder first on the path), round after round, and the CPU time of each process (user +
system, from ``getrusage`` of the children) and its wall time are kept. The commands do no
work of their own (a group's help, a list of an empty folder), so the figures are the start.

Run with ``python -m loadtest.cli_bench --before ../earlier-checkout [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import provenance

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "cli-start"

COMMANDS: tuple[tuple[str, ...], ...] = (
    ("rules", "list", "--policy-dir", "{tmp}/policy"),
    ("lists", "--help"),
    ("model", "--help"),
    ("decisions", "--help"),
    ("score", "--help"),
)
"""Commands that only start: the policy store's list of an empty folder, and help pages."""


def _run(checkout: Path, argv: tuple[str, ...]) -> tuple[float, float]:
    """CPU and wall seconds of ``python -m services.cli ARGV`` in ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *argv],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {checkout} failed: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def measure(before: Path, after: Path, rounds: int) -> dict[str, Any]:
    """Per command: each side's CPU and wall seconds per round, alternating sides."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        commands = [tuple(a.format(tmp=tmp) for a in c) for c in COMMANDS]
        for argv in commands:
            _run(after, argv)  # the first start warms the file cache for both sides
            _run(before, argv)
            sides: dict[str, dict[str, list[float]]] = {
                "before": {"cpu": [], "wall": []},
                "after": {"cpu": [], "wall": []},
            }
            for r in range(rounds):
                order = (("before", before), ("after", after))
                for side, checkout in order if r % 2 == 0 else order[::-1]:
                    cpu, wall = _run(checkout, argv)
                    sides[side]["cpu"].append(cpu)
                    sides[side]["wall"].append(wall)
            ratios = [
                a / b for a, b in zip(sides["after"]["cpu"], sides["before"]["cpu"], strict=True)
            ]
            rows.append(
                {
                    "command": " ".join(argv).replace(tmp, "<empty folder>"),
                    **{f"{side}_{k}_s": v for side, d in sides.items() for k, v in d.items()},
                    **{
                        f"{side}_{k}_median_s": round(statistics.median(v), 3)
                        for side, d in sides.items()
                        for k, v in d.items()
                    },
                    "cpu_ratio_median": round(statistics.median(ratios), 3),
                    "cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                }
            )
    return {"rounds": rounds, "before": provenance.git_commit(before), "rows": rows}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# fraudmesh command start-up: this checkout against another",
        "",
        f"Before: commit {result['before']}. {result['rounds']} rounds, sides alternating; "
        "CPU is user + system of the process, medians of the rounds.",
        "",
        "| command | CPU s before | CPU s after | wall s before | wall s after "
        "| CPU ratio (median of rounds) | range |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        low, high = row["cpu_ratio_range"]
        lines.append(
            f"| `fraudmesh {row['command']}` | {row['before_cpu_median_s']:.2f} "
            f"| {row['after_cpu_median_s']:.2f} "
            f"| {row['before_wall_median_s']:.2f} "
            f"| {row['after_wall_median_s']:.2f} "
            f"| {row['cpu_ratio_median']:.2f}× | {low:.2f}–{high:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _command(before: Path) -> str:
    """This run's command, the other checkout named by its commit."""
    return provenance.naming_checkouts(
        provenance.command_line(), {str(before): provenance.other_checkout(before)}
    )


def main(argv: list[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    after = Path(__file__).resolve().parent.parent
    result = measure(args.before.resolve(), after, args.rounds)
    text = _markdown(result)
    paths = provenance.write(RESULTS / STEM, result, text, provenance.record(_command(args.before)))
    print(text)
    print("written:", *paths)


if __name__ == "__main__":
    main()
