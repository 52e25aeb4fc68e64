"""The live loop's cost on the hot path: the mesh with the loop on and off, side by side.

``python -m loadtest.liveloop [--store sqlite] [--rates 200,400] [--rounds 4] [--run-s 20]``
starts two meshes at once on free ports, each on its own copy of the dataset, registry,
online store and model, and measures three sides:

- **on**: the gateway appends a decision event after every answer (a done callback), the
  feature updater applies the events to the online store, the decision sink writes them;
- **emit-only**: the same mesh with its updater, decision sink and monitor paused (SIGSTOP)
  during the run: what emitting alone does, without the consumers' CPU on the same two
  cores (resumed, they catch up before the next run);
- **off**: ``live_loop=False``: no producer, no done callback, no updater, no sink.

ghz drives ``Score`` through the mesh's Envoy, open loop, 42 ms deadline per call, the same
2,000-request mix on every side (unique transaction ids per run, timestamps at call time).
Each round visits every rate and runs the sides back to back, their order rotating from one
rate to the next, so that the shared machine's drifts fall on every side alike; every figure
is then a median over the rounds, and differences against off are taken per round (paired)
before their median.

Per run: p50 / p99 / p99.9 (errors included), errors, answers with default features and by
the rules (the gateway's decision counters), CPU milliseconds per call of every process of
the mesh (psutil, user + system, over the run), the gateway's main thread (its event loop:
grpc's callbacks, the pipeline and, with the loop on, the done callback that builds and
appends the event) apart from its other threads (grpc's pollers and, with the loop on, the
event log's sender thread), the CPU the idle mesh used meanwhile, and the load average.

The emit cost is the gateway's CPU per call against off (over the pairs answered alike: a
degraded answer skips downstream calls and costs the gateway less); the target is at most
0.15 ms. p99 counts as changed only when every run of one side is slower than every run of
the other (with 4 rounds, a chance of 1 in 35 when the two sides are alike). At the end,
the event log counters of the "on" gateway and the updater's records say whether every
answer became an event and reached the updater.

Results go to ``loadtest/results/liveloop-<store>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from loadtest import data, ghz, provenance
from loadtest.runner import (
    RESULTS_DIR,
    check_state,
    copy_state,
    machine_line,
    mesh_answers,
    start_mesh,
)
from services.common import metric_catalogue as catalogue
from services.common import scrape
from services.mesh import Mesh

SIDES = ("on", "emit-only", "off")
"""The loop on; the loop on with its consumers paused during the run; the loop off."""
MESH_OF = {"on": "on", "emit-only": "on", "off": "off"}
"""Which mesh each side runs on."""
EMIT_BUDGET_MS = 0.15
"""Most CPU emitting may cost per Score."""
SERVING = ("envoy", "gateway", "features", "scorer", "redis")
"""Processes on the request path (Redis only with the Redis store)."""
CONSUMERS = ("updater", "decisionlog", "monitor")
"""Processes that only the loop runs."""
LIKE_FOR_LIKE = 0.05
"""Largest difference of degraded-answer shares within a like-for-like pair."""
MIN_ROUNDS = 3
"""Fewest runs per side for a verdict on p99."""

Log = Callable[[str], None]


def _cpu(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system) so far of each process and its children."""
    out: dict[str, float] = {}
    for name, proc in procs.items():
        total = 0.0
        try:
            for p in (proc, *proc.children(recursive=True)):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        out[name] = total
    return out


def _threads(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds of a process's main thread and of all its other threads."""
    main = other = 0.0
    try:
        for t in proc.threads():
            if t.id == proc.pid:
                main += t.user_time + t.system_time
            else:
                other += t.user_time + t.system_time
    except psutil.Error:
        pass
    return main, other


ACCOUNTED = (
    catalogue.DECISIONS,
    catalogue.EVENTLOG_APPENDED,
    catalogue.EVENTLOG_DELIVERED,
    catalogue.EVENTLOG_SPILLED,
    catalogue.EVENTLOG_DROPPED,
    catalogue.EVENT_EMIT_ERRORS,
)
"""The gateway's counters the accounting of the "on" mesh sums."""
DECISIONS_CONSUMED = f"{catalogue.UPDATER_RECORDS.name}{{kind=decision}}"
"""The accounting's key of the decision records the updater consumed."""


class Side:
    """One of the two meshes and how to measure a run on it."""

    def __init__(self, name: str, mesh: Mesh, work: Path) -> None:
        self.name = name
        self.mesh = mesh
        self.work = work
        self.procs = {
            n: psutil.Process(p.pid) for n, p in mesh.processes.items() if p.pid is not None
        }
        self.answers = mesh_answers(mesh)

    @property
    def target(self) -> str:
        """Envoy's host:port."""
        return self.mesh.config.envoy_target

    def metrics_url(self, process: str) -> str | None:
        """The /metrics URL of one of the mesh's processes, if it exposes one."""
        port = self.mesh.config.metrics_ports.get(process)
        return None if port is None else scrape.url(self.mesh.config.host, port)

    def check_alive(self) -> None:
        """Raises when a process of the mesh has exited."""
        gone = [p.name for p in self.mesh.dead()]
        if gone:
            raise RuntimeError(f"{self.name}: exited during the run: {', '.join(gone)}")


def requests_file(path: Path, population: Sequence[data.Txn], tag: str) -> Path:
    """The request mix with transaction ids unique to this run (``tag``) and to each call."""
    requests = data.score_requests(population, "template")
    for request in requests:
        request["transaction_id"] = f"{tag}-{request['transaction_id']}"
    return data.write_data_file(path, requests)


def measure(side: Side, idle: Side, rps: int, run_s: float, file: Path) -> dict[str, Any]:
    """One run of ``side`` at ``rps`` while ``idle`` stands by."""
    gateway = side.procs["gateway"]
    answers_before = side.answers() if side.answers is not None else {}
    load_before = os.getloadavg()[0]
    idle_before = sum(_cpu(idle.procs).values())
    cpu_before, threads_before = _cpu(side.procs), _threads(gateway)
    started = time.monotonic()
    result = ghz.run_ghz(ghz.SCORE, side.target, file, rps=rps, duration_s=run_s, timeout_ms=42)
    cpu_after, threads_after = _cpu(side.procs), _threads(gateway)
    wall = time.monotonic() - started
    idle_after = sum(_cpu(idle.procs).values())
    load_after = os.getloadavg()[0]
    answers_after = side.answers() if side.answers is not None else {}
    side.check_alive()
    calls = max(result.count, 1)
    per_call = {n: (cpu_after[n] - cpu_before.get(n, 0.0)) * 1000 / calls for n in cpu_after}
    grown = {k: v - answers_before.get(k, 0.0) for k, v in answers_after.items()}
    answered = sum(v for k, v in grown.items() if k.startswith("scored_by="))
    return {
        "side": side.name,
        "rps": rps,
        "result": result.to_dict(),
        "default_share": grown.get("feature_source=default", 0.0) / answered if answered else 0,
        "rules_share": grown.get("scored_by=rules", 0.0) / answered if answered else 0,
        "cpu_ms_per_call": per_call,
        "gateway_main_ms_per_call": (threads_after[0] - threads_before[0]) * 1000 / calls,
        "gateway_other_ms_per_call": (threads_after[1] - threads_before[1]) * 1000 / calls,
        "serving_ms_per_call": sum(v for n, v in per_call.items() if n in SERVING),
        "consumers_ms_per_call": sum(v for n, v in per_call.items() if n in CONSUMERS),
        "mesh_ms_per_call": sum(per_call.values()),
        "idle_mesh_cpu_share": (idle_after - idle_before) / wall,
        "load_average": [round(load_before, 2), round(load_after, 2)],
    }


def accounting(side: Side, settle_s: float = 3.0) -> dict[str, float]:
    """What became of the answers of the "on" mesh: decisions counted by the gateway, events
    appended, delivered, spilled and dropped by its producer, emit errors, and decision
    records the updater consumed (read after ``settle_s`` for the last batches)."""
    time.sleep(settle_s)
    gateway, updater = side.metrics_url("gateway"), side.metrics_url("updater")
    out: dict[str, float] = {}
    if gateway is not None:
        page = scrape.fetch(gateway)
        out.update({spec.name: page.sum(spec) for spec in ACCOUNTED})
    if updater is not None:
        out[DECISIONS_CONSUMED] = _decisions_consumed(updater)
    return out


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _versus_off(
    runs: Sequence[dict[str, Any]], rps: int, side: str, rounds: Sequence[int]
) -> dict[str, Any]:
    """``side`` against "off" at ``rps``: differences per round, their medians, verdicts."""
    paired: dict[str, list[float]] = {}
    like: list[float] = []
    for rnd in rounds:
        pair = {
            r["side"]: r
            for r in runs
            if r["rps"] == rps and r["round"] == rnd and r["side"] in (side, "off")
        }
        if len(pair) != 2:
            continue
        on, off = pair[side], pair["off"]
        # Degraded answers skip downstream calls and cost the gateway less: only pairs
        # answered alike compare the gateway's CPU like for like.
        if (
            abs(on["default_share"] - off["default_share"]) < LIKE_FOR_LIKE
            and abs(on["rules_share"] - off["rules_share"]) < LIKE_FOR_LIKE
        ):
            like.append(_value(on, "gateway_ms") - _value(off, "gateway_ms"))
        for key in (
            "gateway_ms",
            "gateway_main_ms_per_call",
            "gateway_other_ms_per_call",
            "serving_ms_per_call",
            "mesh_ms_per_call",
            "p99_ms",
            "p50_ms",
        ):
            paired.setdefault(key, []).append(_value(on, key) - _value(off, key))
    on_p99 = [r["result"]["p99_ms"] for r in runs if r["rps"] == rps and r["side"] == side]
    off_p99 = [r["result"]["p99_ms"] for r in runs if r["rps"] == rps and r["side"] == "off"]
    if min(len(on_p99), len(off_p99)) < MIN_ROUNDS:
        p99_verdict = "too few rounds to tell"
    elif min(on_p99) > max(off_p99) or max(on_p99) < min(off_p99):
        p99_verdict = "the runs do not overlap: measurable"
    else:
        p99_verdict = "the runs overlap: nothing measurable"
    later = sum(1 for d in paired.get("p99_ms", []) if d > 0)
    # The like-for-like pairs when at least half the rounds are, else every pair.
    alike = 2 * len(like) >= len(paired.get("gateway_ms", []))
    emit_ms = _median(like if alike else paired.get("gateway_ms", []))
    return {
        "paired_minus_off": paired,
        "median_paired": {k: _median(v) for k, v in paired.items()},
        "p99_higher_in_pairs": later,
        "like_for_like_gateway_ms": like,
        "emit_cpu_ms_per_call": emit_ms,
        "emit_from_like_for_like": alike,
        "emit_within_budget": emit_ms <= EMIT_BUDGET_MS,
        "p99_verdict": p99_verdict,
    }


def summarize(runs: Sequence[dict[str, Any]], rates: Sequence[int]) -> list[dict[str, Any]]:
    """Per rate: medians of each side; each side with events against "off", paired by round."""
    out = []
    sides = [s for s in SIDES if any(r["side"] == s for r in runs)]
    for rps in rates:
        by_side = {s: [r for r in runs if r["rps"] == rps and r["side"] == s] for s in sides}
        rounds = sorted({r["round"] for r in runs if r["rps"] == rps})
        medians = {
            side: {
                key: _median([_value(r, key) for r in cells])
                for key in (
                    "p50_ms",
                    "p99_ms",
                    "p999_ms",
                    "default_share",
                    "rules_share",
                    "gateway_ms",
                    "gateway_main_ms_per_call",
                    "gateway_other_ms_per_call",
                    "serving_ms_per_call",
                    "consumers_ms_per_call",
                    "mesh_ms_per_call",
                )
            }
            | {
                "errors": sum(r["result"]["count"] * r["result"]["error_share"] for r in cells),
                "calls": sum(r["result"]["count"] for r in cells),
                "p99_ms_runs": [r["result"]["p99_ms"] for r in cells],
                "process_ms_per_call": {
                    n: _median([r["cpu_ms_per_call"].get(n, 0.0) for r in cells])
                    for n in dict.fromkeys(n for r in cells for n in r["cpu_ms_per_call"])
                },
            }
            for side, cells in by_side.items()
        }
        out.append(
            {
                "rps": rps,
                "rounds": len(rounds),
                "medians": medians,
                "versus_off": {
                    side: _versus_off(runs, rps, side, rounds) for side in sides if side != "off"
                },
            }
        )
    return out


def _value(run: dict[str, Any], key: str) -> float:
    if key in ("p50_ms", "p99_ms", "p999_ms"):
        return float(run["result"][key])
    if key == "gateway_ms":
        return float(run["cpu_ms_per_call"].get("gateway", 0.0))
    return float(run[key])


def markdown(
    runs: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    counts: dict[str, float],
    command: str,
    store: str,
    eventlog: str,
    run_s: float,
) -> str:
    """The report: every run, then per rate the medians, paired differences and verdicts."""
    lines = [
        f"# The live loop on the hot path: {store} store, {eventlog} event log",
        "",
        f"`{command}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine_line()}.",
        "",
        "Two meshes at once (Envoy → gateway → feature service + scorer), each on its own copy "
        "of the state: **on** (decision event after every answer, feature updater, decision "
        "sink) and **off** (`live_loop=False`); **emit-only** is the *on* mesh with its updater "
        "and decision sink paused (SIGSTOP) during the run, so that it shows what emitting alone "
        "does, without the consumers' CPU on the same two cores (they catch up before the next "
        "run). ghz open loop through Envoy, 42 ms deadline, "
        f"{run_s:g} s per run, unique transaction ids, timestamps at call time; the sides back "
        "to back at each rate, their order rotating from one rate to the next. CPU: user + system of each "
        "process over the run, per call made; *gateway main*: its event-loop thread (grpc "
        "callbacks, pipeline, the done callback that builds and appends the event); *other*: "
        "its other threads (grpc pollers, the event log's sender thread). *Serving*: Envoy, "
        "gateway, feature service, scorer (and Redis); *loop*: updater, decision sink and "
        "monitor. "
        "*Idle mesh*: CPU the other mesh used meanwhile (share of a core). Load average: "
        "1-minute, at the start and the end of the run.",
        "",
        "| round | rps | side | p50 ms | p99 ms | p99.9 ms | errors | default features | "
        "by rules | gateway CPU ms/call (main + other) | serving | loop | mesh | idle mesh | "
        "load avg |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        res = r["result"]
        errors = round(res["count"] * res["error_share"])
        lines.append(
            f"| {r['round']} | {r['rps']} | {r['side']} | {res['p50_ms']:.2f} | "
            f"{res['p99_ms']:.2f} | {res['p999_ms']:.2f} | {errors} | "
            f"{r['default_share']:.1%} | {r['rules_share']:.1%} | "
            f"{_value(r, 'gateway_ms'):.3f} ({r['gateway_main_ms_per_call']:.3f} + "
            f"{r['gateway_other_ms_per_call']:.3f}) | {r['serving_ms_per_call']:.2f} | "
            f"{r['consumers_ms_per_call']:.2f} | {r['mesh_ms_per_call']:.2f} | "
            f"{r['idle_mesh_cpu_share']:.1%} | "
            f"{r['load_average'][0]:.1f}–{r['load_average'][1]:.1f} |"
        )
    lines += [
        "",
        "## Medians over the rounds",
        "",
        "| rps | side | calls | errors | p50 ms | p99 ms (runs) | p99.9 ms | default features | "
        "by rules | gateway CPU ms/call | main | other | serving | loop | mesh |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        for side in s["medians"]:
            m = s["medians"][side]
            runs_p99 = ", ".join(f"{v:.1f}" for v in m["p99_ms_runs"])
            lines.append(
                f"| {s['rps']} | {side} | {m['calls']} | {round(m['errors'])} | "
                f"{m['p50_ms']:.2f} | {m['p99_ms']:.2f} ({runs_p99}) | {m['p999_ms']:.2f} | "
                f"{m['default_share']:.1%} | {m['rules_share']:.1%} | {m['gateway_ms']:.3f} | "
                f"{m['gateway_main_ms_per_call']:.3f} | {m['gateway_other_ms_per_call']:.3f} | "
                f"{m['serving_ms_per_call']:.2f} | {m['consumers_ms_per_call']:.2f} | "
                f"{m['mesh_ms_per_call']:.2f} |"
            )
    lines += [
        "",
        "CPU ms per call by process (medians):",
        "",
        "| rps | side | " + " | ".join(_processes(summary)) + " |",
        "|---:|---|" + "---:|" * len(_processes(summary)),
    ]
    for s in summary:
        for side in s["medians"]:
            per = s["medians"][side]["process_ms_per_call"]
            lines.append(
                f"| {s['rps']} | {side} | "
                + " | ".join(f"{per[n]:.3f}" if n in per else "–" for n in _processes(summary))
                + " |"
            )
    lines += [
        "",
        "## Against off, paired by round (median of the differences)",
        "",
        "*Like for like*: pairs whose two runs had default features and rules within "
        f"{LIKE_FOR_LIKE:.0%} of each other (a degraded answer skips downstream calls and costs "
        "the gateway less); the emit cost is their median when at least half the pairs are, "
        "else the median of every pair. *p99 higher*: in how many pairs the side's p99 was "
        "above off's. p99 counts as changed only when every run of one side is slower than "
        "every run of the other.",
        "",
        "| rps | side − off | pairs | gateway CPU ms/call | like for like (pairs) | main | "
        "other | serving ms/call | mesh ms/call | p50 ms | p99 ms | p99 higher | "
        "emit ≤ 0.15 ms | p99 |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    nan = float("nan")
    for s in summary:
        for side, v in s["versus_off"].items():
            d = v["median_paired"]
            like = v["like_for_like_gateway_ms"]
            pairs = len(v["paired_minus_off"].get("p99_ms", []))
            lines.append(
                f"| {s['rps']} | {side} | {pairs} | {d.get('gateway_ms', nan):+.3f} | "
                + (f"{_median(like):+.3f} ({len(like)})" if like else "– (0)")
                + " | "
                f"{d.get('gateway_main_ms_per_call', nan):+.3f} | "
                f"{d.get('gateway_other_ms_per_call', nan):+.3f} | "
                f"{d.get('serving_ms_per_call', nan):+.2f} | "
                f"{d.get('mesh_ms_per_call', nan):+.2f} | "
                f"{d.get('p50_ms', nan):+.2f} | {d.get('p99_ms', nan):+.2f} | "
                f"{v['p99_higher_in_pairs']} of {pairs} | "
                f"{'met' if v['emit_within_budget'] else 'missed'} "
                f"({v['emit_cpu_ms_per_call']:+.3f}) | {v['p99_verdict']} |"
            )
    if counts:
        count = {spec: counts.get(spec.name, 0.0) for spec in ACCOUNTED}
        lines += [
            "",
            f"Events of the **on** mesh over the whole run (warm-up included): "
            f"{count[catalogue.DECISIONS]:.0f} answers counted by the gateway, "
            f"{count[catalogue.EVENTLOG_APPENDED]:.0f} events appended, "
            f"{count[catalogue.EVENTLOG_DELIVERED]:.0f} delivered, "
            f"{count[catalogue.EVENTLOG_SPILLED]:.0f} spilled, "
            f"{count[catalogue.EVENTLOG_DROPPED]:.0f} dropped, "
            f"{count[catalogue.EVENT_EMIT_ERRORS]:.0f} emit errors; "
            f"{counts.get(DECISIONS_CONSUMED, 0):.0f} decision "
            "records consumed by the updater.",
        ]
    return "\n".join(lines) + "\n"


def _processes(summary: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for s in summary:
        for side in s["medians"]:
            names.update(dict.fromkeys(s["medians"][side]["process_ms_per_call"]))
    return list(names)


def _updater_behind(mesh: Side) -> bool:
    """True while the updater has consumed fewer decisions than the gateway delivered."""
    gateway, updater = mesh.metrics_url("gateway"), mesh.metrics_url("updater")
    if gateway is None or updater is None:
        return False
    delivered = scrape.fetch(gateway).sum(catalogue.EVENTLOG_DELIVERED)
    return _decisions_consumed(updater) < delivered


def _decisions_consumed(url: str) -> float:
    return scrape.fetch(url).sum(catalogue.UPDATER_RECORDS, kind="decision")


@contextlib.contextmanager
def consumers_paused(mesh: Side, catch_up_s: float = 120.0) -> Iterator[None]:
    """Stops the mesh's updater, decision sink and monitor (SIGSTOP) for the block, then lets
    them catch up with what the gateway appended meanwhile before returning."""
    pids = [mesh.procs[n].pid for n in CONSUMERS if n in mesh.procs]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + catch_up_s
    while _updater_behind(mesh) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)  # the decision sink's flush, too


def run(
    var_dir: Path,
    store: str,
    rates: Sequence[int],
    rounds: int,
    run_s: float,
    warmup_s: float,
    sides: Sequence[str] = SIDES,
    log: Log = print,
) -> tuple[list[dict[str, Any]], dict[str, float], str]:
    """Starts both meshes, runs the rounds, stops the meshes; returns every run, the "on"
    mesh's event accounting and its event log backend."""
    check_state(var_dir)
    population = data.sample_population(var_dir / "data", 2000)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="liveloop-bench-") as tmp:
        meshes: dict[str, Side] = {}
        try:
            for name in ("on", "off"):
                work = copy_state(var_dir, Path(tmp) / name)
                log(f"starting the mesh with the live loop {name} ({store} store) …")
                mesh = start_mesh(
                    work, store, work / "logs", live_loop=name == "on", log=lambda _: None
                )
                meshes[name] = Side(name, mesh, work)
            for name, mesh_side in meshes.items():
                file = requests_file(mesh_side.work / "warmup.json", population, f"w{name}")
                ghz.run_ghz(ghz.SCORE, mesh_side.target, file, rps=rates[0],
                            duration_s=warmup_s, timeout_ms=42)  # fmt: skip
            turn = 0
            for rnd in range(1, rounds + 1):
                for rps in rates:
                    # The order rotates, so that no side always runs first (or after another).
                    order = [sides[(turn + i) % len(sides)] for i in range(len(sides))]
                    turn += 1
                    for name in order:
                        home = MESH_OF[name]
                        side, idle = meshes[home], meshes["off" if home == "on" else "on"]
                        file = requests_file(
                            side.work / "score.json", population, f"r{rnd}-{rps}-{turn}-{home}"
                        )
                        paused = (
                            consumers_paused(side)
                            if name == "emit-only"
                            else contextlib.nullcontext()
                        )
                        with paused:
                            cell = measure(side, idle, rps, run_s, file)
                        cell["side"] = name
                        cell["round"] = rnd
                        runs.append(cell)
                        res = cell["result"]
                        log(
                            f"round {rnd} {rps} rps {name:>9}: p50 {res['p50_ms']:.2f} "
                            f"p99 {res['p99_ms']:.2f} p99.9 {res['p999_ms']:.2f} ms, "
                            f"errors {res['error_share']:.2%}, "
                            f"default {cell['default_share']:.1%}, "
                            f"gateway {_value(cell, 'gateway_ms'):.3f} ms/call, "
                            f"mesh {cell['mesh_ms_per_call']:.2f} ms/call, "
                            f"load {cell['load_average'][1]:.1f}"
                        )
            counts = accounting(meshes["on"])
            eventlog = meshes["on"].mesh.config.eventlog_backend
        finally:
            for mesh_side in meshes.values():
                mesh_side.mesh.stop()
    return runs, counts, eventlog


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the comparison and writes ``liveloop-<store>.md`` and ``.json``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--store", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument("--rates", default="200,400")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--run-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument(
        "--sides", default=",".join(SIDES), help=f"Which of {', '.join(SIDES)} to run."
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None, help="Base name; default liveloop-<store>.")
    args = parser.parse_args(args_list)
    rates = [int(r) for r in args.rates.split(",") if r]
    command = " ".join(["python -m loadtest.liveloop", *args_list])
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = set(sides) - set(SIDES)
    if unknown or "off" not in sides or len(sides) < 2:
        parser.error(f"--sides: off and at least one of on, emit-only; not {sorted(unknown)}")
    runs, counts, eventlog = run(
        args.var_dir, args.store, rates, args.rounds, args.run_s, args.warmup_s, sides
    )
    summary = summarize(runs, rates)
    name = args.name or f"liveloop-{args.store}"
    args.out.mkdir(parents=True, exist_ok=True)
    report = markdown(runs, summary, counts, command, args.store, eventlog, args.run_s)
    prov = provenance.record(command)
    (args.out / f"{name}.md").write_text(provenance.markdown(report, prov))
    (args.out / f"{name}.json").write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "command": command,
                "finished": datetime.now(UTC).isoformat(),
                "machine": machine_line(),
                "store": args.store,
                "eventlog": eventlog,
                "run_s": args.run_s,
                "emit_budget_ms": EMIT_BUDGET_MS,
                "runs": runs,
                "summary": summary,
                "accounting": counts,
            },
            indent=2,
        )
    )
    print(report)
    print(f"wrote {args.out / (name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
