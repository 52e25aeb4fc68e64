"""The default ``fraudmesh up`` of this checkout against another's, side by side under load.

Each checkout runs its own ``fraudmesh up`` with its own defaults (what a user gets without
flags: the topology it sizes, the observability stack, the live loop) on its own prepared
state (``--var-dir`` and ``--before-var-dir``, each copied afresh for every mesh: dataset,
registry, online store and models, no live-loop state). The sides take turns, the order
alternating round by round. Once a mesh answers, ghz (open loop, ``--async``, a 42 ms
deadline, every request a new transaction of the dataset's cards and merchants with a
timestamp of now) drives each rate, once the mesh has settled (``--settle`` seconds, then
until the whole tree spends under ``--quiet`` of a core over two seconds, at most a minute:
the tail of a start, a console's imports or a first checkpoint, is no cost of a Score), of ``--rates`` for ``--seconds`` after a short warm-up;
the CPU time (user + system) of ``fraudmesh up`` and every process under it is read before
and after each step. Reported per side and rate, medians over the rounds: CPU ms per Score of
the whole tree, p50/p99, the share of calls failed or late (over 42 ms), and the errors by
status; the CPU per Score of each process (replicas of a part summed); and the ratio of
this checkout's CPU per Score to the other's, round by round. Past
saturation, what the edge let in and what it refused: the calls refused at once
(RESOURCE_EXHAUSTED) and the p99 of their latency, the share of the calls let in that failed
or were late, the goodput (answers OK within 42 ms per second) and the calls that ran out
their deadline or found no server (DEADLINE_EXCEEDED, UNAVAILABLE).

Run with ``python -m loadtest.up_bench --before ../landed --before-var-dir ../landed/var``;
report: ``loadtest/results/up-default.md`` and ``.json`` (``--name`` another stem).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from loadtest import data, ghz, provenance, report, runner
from services.common import scrape
from services.mesh.process import free_port_block, up_ports

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "up-default"
BUDGET_MS = 42.0
REFUSED = "ResourceExhausted"
"""The status of a call the edge refuses at once (admission, docs/reliability.md)."""
ADMISSION = ("refused", "refusal_p99_ms", "accepted_late_share", "goodput_rps")
"""Each step's figures of what the edge let in and what it refused."""
PORTS = (
    "envoy",
    "admin",
    "gateway",
    "features",
    "scorer",
    "redis",
    "decisionlog",
    "updater",
    "monitor",
    "console",
    "prometheus",
    "otlp",
)
"""The ``--<name>-port`` options both sides' ``fraudmesh up`` take."""
REPLICATED = ("admin", "gateway", "features", "scorer")
"""Parts whose replicas listen ``--replica-port-step`` (100) above the part's port."""


METRICS_BLOCK = 24
"""Ports from ``--metrics-port`` on that ``fraudmesh up`` may give its processes' /metrics
(one each, replicas after the others)."""


def _answers_by_kind(first: int) -> dict[str, float]:
    """The gateways' decisions so far by ``scored_by=…`` and ``feature_source=…``, summed over
    every /metrics of the block that answers (only gateways count decisions)."""
    total: dict[str, float] = {}
    for port in range(first, first + METRICS_BLOCK):
        try:
            counts = runner.gateway_answers(scrape.url("127.0.0.1", port))()
        except (OSError, ValueError):  # a port of the block nothing serves
            continue
        for key, value in counts.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _answers(target: str, requests: Path, timeout_s: float) -> None:
    """Waits until the edge answers a Score OK (the mesh is up and routes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = ghz.run_ghz(ghz.SCORE, target, requests, rps=20, duration_s=1, timeout_ms=500)
        if result.count and all(c.status == "OK" for c in result.calls):
            return
        time.sleep(1)
    raise RuntimeError(f"no answer from {target} within {timeout_s:.0f} s")


def _tree_cpu(up: psutil.Process) -> float:
    """CPU seconds so far of ``up`` and every process under it."""
    total = 0.0
    for process in [up, *up.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def _role(process: psutil.Process) -> str:
    """What a process of the tree is: its ``services.<part>`` module (replicas share one
    role), else its program's name (envoy, prometheus, otelcol-fraudmesh)."""
    argv = process.cmdline()
    for arg in argv:
        if arg.startswith("services."):
            part = arg.split(".")[1]
            return "supervisor" if part == "cli" else part
    return Path(argv[0]).name if argv else "?"


def _cpu_by_role(up: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of ``up`` and every process under it, summed by ``_role``."""
    out: dict[str, float] = {}
    for process in [up, *up.children(recursive=True)]:
        try:
            times = process.cpu_times()
            role = _role(process)
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + times.user + times.system
    return out


def _settle(tree: psutil.Process, least_s: float, quiet: float, most_s: float = 60.0) -> float:
    """Waits ``least_s``, then until the tree's CPU over two seconds is under ``quiet`` cores
    (at most ``most_s`` in all); returns the seconds waited."""
    start = time.monotonic()
    time.sleep(least_s)
    while time.monotonic() - start < most_s:
        before = _tree_cpu(tree)
        time.sleep(2.0)
        if (_tree_cpu(tree) - before) / 2.0 < quiet:
            break
    return round(time.monotonic() - start, 1)


def _side(
    checkout: Path, state: Path, work: Path, rates: Sequence[int], args: argparse.Namespace
) -> dict[str, Any]:
    """One mesh of one side: every rate in turn."""
    var = runner.copy_state(state, work / "var")
    # Room for up to three replicas of a part, whatever the side's sizing chooses.
    ports = up_ports(PORTS, REPLICATED, replicas=3)
    metrics = free_port_block(METRICS_BLOCK)
    argv = [
        sys.executable, "-m", "services.cli", "up", "--var-dir", str(var),
        *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port))),
        "--metrics-port", str(metrics),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    log = (work / "up.log").open("wb")
    up = subprocess.Popen(argv, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT)
    steps: list[dict[str, Any]] = []
    try:
        target = f"127.0.0.1:{ports['envoy']}"
        population = data.sample_population(var / "data", 2000)
        fresh = runner.request_source(population, work / "score.json")
        _answers(target, fresh(), args.start_timeout)
        processes = 1 + len(psutil.Process(up.pid).children(recursive=True))
        tree = psutil.Process(up.pid)
        settled_s = _settle(tree, args.settle, args.quiet)
        ghz.run_ghz(ghz.SCORE, target, fresh(), rps=rates[0], duration_s=3, timeout_ms=BUDGET_MS)
        for rate in rates:
            requests = fresh()
            roles_before = _cpu_by_role(tree)
            before = sum(roles_before.values())
            answered = _answers_by_kind(metrics)
            result = ghz.run_ghz(
                ghz.SCORE, target, requests, rps=rate, duration_s=args.seconds,
                timeout_ms=BUDGET_MS,
            )  # fmt: skip
            roles_after = _cpu_by_role(tree)
            spent = sum(roles_after.values()) - before
            roles = {
                role: seconds - roles_before.get(role, 0.0) for role, seconds in roles_after.items()
            }
            now = _answers_by_kind(metrics)
            step = report.Step(
                result, answers={k: v - answered.get(k, 0.0) for k, v in now.items()}
            )
            count = max(result.count, 1)
            errors = Counter(c.status for c in result.calls if c.status != "OK")
            late = sum(1 for c in result.calls if c.status != "OK" or c.latency_ms > BUDGET_MS)
            refused = errors.get(REFUSED, 0)
            on_time = sum(1 for c in result.calls if c.status == "OK" and c.latency_ms <= BUDGET_MS)
            steps.append(
                {
                    "rps": rate,
                    "calls": result.count,
                    "achieved_rps": round(result.achieved_rps, 1),
                    "cpu_ms_per_score": round(spent / count * 1000, 3),
                    # A process that restarted during the step counts from its new start.
                    "cpu_ms_per_score_by_process": {
                        role: round(max(seconds, 0.0) / count * 1000, 3)
                        for role, seconds in sorted(roles.items())
                    },
                    "p50_ms": round(result.p50_ms, 2),
                    "p99_ms": round(result.p99_ms, 2),
                    "failed_or_late": late,
                    "failed_or_late_share": round(late / count, 5),
                    "errors": dict(errors),
                    "refused": refused,
                    "refusal_p99_ms": round(result.status_p99_ms.get(REFUSED, math.nan), 2),
                    # Of the calls the edge let in: not answered OK within the budget.
                    "accepted_late_share": round((late - refused) / max(count - refused, 1), 5),
                    "goodput_rps": round(on_time / args.seconds, 1),
                    "degraded_shares": step.shares(),
                    "full_quality": step.full_quality(),
                }
            )
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(90)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
        log.close()
    return {"processes": processes, "settled_s": settled_s, "steps": steps}


def measure(
    before: Path, before_var: Path, after: Path, after_var: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The rounds, sides alternating; the medians and the round-by-round CPU ratios."""
    rates = [int(r) for r in args.rates.split(",")]
    sides = {"before": (before, before_var), "after": (after, after_var)}
    runs: list[dict[str, Any]] = []
    for index in range(args.rounds):
        order = ["before", "after"] if index % 2 == 0 else ["after", "before"]
        for side in order:
            checkout, state = sides[side]
            print(f"round {index + 1}: {side} …", flush=True)
            work = Path(tempfile.mkdtemp(prefix="up-bench-"))
            try:
                runs.append(
                    {"round": index + 1, "side": side, **_side(checkout, state, work, rates, args)}
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return {
        "before": provenance.git_commit(before),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "settle": args.settle,
        "quiet": args.quiet,
        **summarize(runs, rates, args.rounds),
        "runs": runs,
    }


def summarize(runs: Sequence[dict[str, Any]], rates: Sequence[int], rounds: int) -> dict[str, Any]:
    """Per rate and side, the medians over the rounds; the after/before CPU ratio per round."""
    sides = ("before", "after")
    summary: dict[str, Any] = {}
    for rate in rates:
        row: dict[str, Any] = {}
        for side in sides:
            cells = [s for r in runs if r["side"] == side for s in r["steps"] if s["rps"] == rate]
            row[side] = {
                key: statistics.median(c[key] for c in cells)
                for key in ("cpu_ms_per_score", "p50_ms", "p99_ms", "failed_or_late_share")
            }
            row[side]["failed_or_late_per_round"] = [c["failed_or_late"] for c in cells]
            for key in ADMISSION:
                values = [c[key] for c in cells if key in c and not math.isnan(c[key])]
                row[side][key] = statistics.median(values) if values else math.nan
            row[side]["timed_out_per_round"] = [
                sum(n for k, n in c["errors"].items() if k in ("DeadlineExceeded", "Unavailable"))
                for c in cells
            ]
            for key in report.DEGRADED:
                row[side][key] = statistics.median(
                    c["degraded_shares"].get(key, math.nan) for c in cells
                )
            roles = sorted({k for c in cells for k in c.get("cpu_ms_per_score_by_process", {})})
            row[side]["cpu_ms_per_score_by_process"] = {
                role: statistics.median(
                    c.get("cpu_ms_per_score_by_process", {}).get(role, 0.0) for c in cells
                )
                for role in roles
            }
            row[side]["full_quality_rounds"] = sum(bool(c["full_quality"]) for c in cells)
            row[side]["calls_per_round"] = [c["calls"] for c in cells]
        ratios = []
        for index in range(1, rounds + 1):
            per = {
                r["side"]: next(s for s in r["steps"] if s["rps"] == rate)["cpu_ms_per_score"]
                for r in runs
                if r["round"] == index
            }
            ratios.append(round(per["after"] / per["before"], 3))
        row["cpu_ratio_per_round"] = ratios
        row["cpu_ratio_median"] = statistics.median(ratios)
        summary[str(rate)] = row
    processes = {
        side: statistics.median(r["processes"] for r in runs if r["side"] == side) for side in sides
    }
    settled = {
        side: statistics.median(r["settled_s"] for r in runs if r["side"] == side) for side in sides
    }
    return {"processes": processes, "settled_s": settled, "summary": summary}


def _share(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def _cells(result: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(rate, side, the rate's row, the side's cell) of the summary, before then after."""
    for rate, row in result["summary"].items():
        for side in ("before", "after"):
            yield rate, side, row, row[side]


def markdown(result: dict[str, Any]) -> str:
    """The report."""
    out = [
        "# The default `fraudmesh up`: this checkout against another",
        "",
        f"Before: commit {result['before']}. Each side's own `fraudmesh up` with its defaults "
        f"(processes under it: before {result['processes']['before']:.0f}, after "
        f"{result['processes']['after']:.0f}), on its own prepared state, copied afresh per "
        f"mesh; {result['rounds']} rounds, sides alternating; measured once settled (at least "
        f"{result['settle']:g} s after the first answer, then until the tree spends under "
        f"{result['quiet']:g} of a core over 2 s: median before {result['settled_s']['before']:g} s, "
        f"after {result['settled_s']['after']:g} s); ghz open loop through Envoy, "
        f"{result['seconds']:g} s per rate, 42 ms deadline, new transactions with timestamps of "
        "now. CPU: user + system of `fraudmesh up` and every process under it, per call made. "
        "*Failed or late*: not OK, or answered after 42 ms. Answers with default features, by the "
        "rules or by the small model standing in for the model: from the gateways' decision "
        "counters; *full quality*: no error, p99 within 42 ms, under 5 % default features and "
        "under 1 % each by the rules and the small model. Medians over the rounds.",
        "",
        "| offered rps | side | CPU ms/Score | p50 ms | p99 ms | failed or late | "
        "failed or late per round | default features | by the rules | by the small model | "
        "full quality (rounds) | CPU after/before per round | median |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for rate, side, row, cell in _cells(result):
        per_round = " / ".join(
            f"{n} of {c}"
            for n, c in zip(cell["failed_or_late_per_round"], cell["calls_per_round"], strict=True)
        )
        ratio = ", ".join(f"{r:.2f}" for r in row["cpu_ratio_per_round"])
        out.append(
            f"| {rate} | {side} | {cell['cpu_ms_per_score']:.2f} | {cell['p50_ms']:.2f} | "
            f"{cell['p99_ms']:.2f} | {cell['failed_or_late_share']:.2%} | {per_round} | "
            f"{_share(cell['feature_source=default'])} | {_share(cell['scored_by=rules'])} | "
            f"{_share(cell['scored_by=small_model'])} | "
            f"{cell['full_quality_rounds']}/{len(cell['calls_per_round'])} | "
            + (f"{ratio} | **{row['cpu_ratio_median']:.2f}×** |" if side == "after" else " | |")
        )
    out += [
        "",
        "## What the edge let in and what it refused",
        "",
        "*Refused*: RESOURCE_EXHAUSTED from the edge's admission; *refusal p99*: the p99 of those "
        "calls' latency at the driver; *accepted, failed or late*: of the calls not refused, the "
        "share not answered OK within 42 ms; *goodput*: calls answered OK within 42 ms per second; "
        "*deadline or unavailable*: DEADLINE_EXCEEDED and UNAVAILABLE calls, per round. Medians "
        "over the rounds.",
        "",
        "| offered rps | side | refused | refusal p99 ms | accepted, failed or late | "
        "goodput calls/s | deadline or unavailable per round |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for rate, side, _, cell in _cells(result):
        refusal = cell["refusal_p99_ms"]
        out.append(
            f"| {rate} | {side} | {cell['refused']:g} | "
            + ("–" if math.isnan(refusal) else f"{refusal:.2f}")
            + f" | {_share(cell['accepted_late_share'])} | {cell['goodput_rps']:.1f} | "
            + " / ".join(str(n) for n in cell["timed_out_per_round"])
            + " |"
        )
    out += _by_process(result)
    return "\n".join(out) + "\n"


def _by_process(result: dict[str, Any]) -> list[str]:
    """The table of CPU ms per Score by process, per rate and side (medians over the rounds)."""
    cells = list(_cells(result))
    roles = sorted(
        {role for *_, cell in cells for role in cell.get("cpu_ms_per_score_by_process", {})},
        key=lambda role: (
            -max(c.get("cpu_ms_per_score_by_process", {}).get(role, 0.0) for *_, c in cells)
        ),
    )
    if not roles:
        return []
    out = [
        "",
        "## CPU per Score by process",
        "",
        "CPU ms per Score of each process under `fraudmesh up`, replicas of a part summed "
        "(the medians of the rounds, which need not add up to the whole tree's median).",
        "",
        "| offered rps | side | " + " | ".join(roles) + " |",
        "|---:|---|" + "---:|" * len(roles),
    ]
    for rate, side, _, cell in cells:
        by = cell.get("cpu_ms_per_score_by_process", {})
        out.append(
            f"| {rate} | {side} | "
            + " | ".join(f"{by[r]:.2f}" if r in by else "–" for r in roles)
            + " |"
        )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.up_bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--before", type=Path, required=True, help="another checkout")
    parser.add_argument(
        "--before-var-dir", type=Path, required=True, help="its prepared state (its make data)"
    )
    parser.add_argument("--var-dir", type=Path, default=Path("var"), help="this checkout's state")
    parser.add_argument("--rates", default="100,200")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--settle", type=float, default=10.0, help="least seconds after the first answer"
    )
    parser.add_argument(
        "--quiet", type=float, default=0.25, help="cores the settled tree spends at most"
    )
    parser.add_argument("--start-timeout", type=float, default=180.0)
    parser.add_argument(
        "--name", default=STEM, help="results file stem in loadtest/results (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    after = Path(__file__).resolve().parent.parent
    for state in (args.var_dir, args.before_var_dir):
        runner.check_state(state)
    result = measure(
        args.before.resolve(), args.before_var_dir.resolve(), after, args.var_dir.resolve(), args
    )
    text = markdown(result)
    command = provenance.naming_checkouts(
        " ".join(["python -m loadtest.up_bench", *(argv if argv is not None else sys.argv[1:])]),
        {
            str(args.before): provenance.other_checkout(args.before),
            str(args.before_var_dir): "<its state folder>",
        },
    )

    paths = provenance.write(RESULTS / args.name, result, text, provenance.record(command))
    print(text)
    print("written:", *paths)


if __name__ == "__main__":
    main()
