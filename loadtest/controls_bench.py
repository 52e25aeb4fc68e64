"""What the fraud team's controls cost on the request path: the mesh with no policy and no
lists against the same mesh with many live rules and a long block list, side by side.

Each round starts a fresh mesh per variant on its own copy of the state folder, in an order
that alternates round by round, and drives Score through Envoy open loop (ghz) at one rate.
The ``controls`` variant gets ``--rules`` live rules and ``--entries`` block-list entries
before its mesh starts. No rule and no entry matches the driven traffic, so both variants
answer the same payments the same way and the difference is the cost of asking them; two
check calls (a card prefix only the policy names, a card only the list names) prove the
controls are loaded and act before anything is measured.

Run with ``python -m loadtest.controls_bench [--rules 100] [--entries 100000] [--rps 100]``;
report: ``loadtest/results/controls-bench.md`` and ``.json``.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from fraud.v1 import scoring_pb2 as pb
from loadtest import data, ghz, provenance, runner
from services import client
from services.domain.lists import ListEntry, ListKind, ListName
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import sizing
from services.models.policies import PolicyStore

VARIANTS = ("plain", "controls")
CHECK_PREFIX = "zzcheck"
"""A card prefix only the policy's first rule names."""
CHECK_CARD = "card-bl-check"
"""A card only the block list names."""


@dataclass(frozen=True)
class Measured:
    """One variant in one round."""

    variant: str
    round: int
    count: int
    p50_ms: float
    p99_ms: float
    late_share: float
    """Calls that failed or took longer than the 42 ms budget."""
    cpu_ms_per_score: float
    """CPU of every process of the mesh per call, in milliseconds."""


def policy_text(rules: int) -> str:
    """``rules`` live rules of every kind of condition, none of which the traffic meets."""
    lines = ["format: 1", "description: controls benchmark", "rules:"]
    lines += [
        f"  - {{name: check, action: decline, priority: 1000, when: {{card_prefix: [{CHECK_PREFIX}]}}}}"
    ]
    for i in range(1, rules):
        kind = i % 4
        if kind == 0:
            when = f"{{channel: card_not_present, amount_eur: {{gt: {1_000_000 + i}}}}}"
        elif kind == 1:
            when = f"{{merchant: [merch-zz{i:04d}, merch-zy{i:04d}], amount_eur: {{gte: 1}}}}"
        elif kind == 2:
            when = f"{{card_prefix: [zz{i:04d}], currency: [EUR, GBP, USD]}}"
        else:
            when = f"{{features: {{card_txn_count_1h: {{gte: {10_000 + i}}}}}}}"
        action = ("decline", "review", "approve")[i % 3]
        lines.append(f"  - {{name: r{i:03d}, action: {action}, priority: {i % 7}, when: {when}}}")
    return "\n".join(lines) + "\n"


def list_entries(count: int) -> list[ListEntry]:
    """``count`` block-list cards, the check card among them; no other card of the traffic."""
    now = time.time()
    cards = [CHECK_CARD, *(f"card-bl-{i:07d}" for i in range(count - 1))]
    return [
        ListEntry(ListKind.CARD, card, ListName.BLOCK, "benchmark", None, now, "bench")
        for card in cards
    ]


def prepare(source: Path, target: Path, variant: str, rules: int, entries: int) -> Path:
    """A fresh copy of the state folder; with controls, the policy live and the list filled."""
    state = runner.copy_state(source, target)
    if variant == "controls":
        store = PolicyStore.in_state_folder(state)
        store.promote(store.publish(policy_text(rules)))
        lists = open_lists(FeatureStoreSettings(var_dir=state))
        assert lists is not None
        try:
            lists.add_many(list_entries(entries))
        finally:
            lists.close()
    return state


def check_controls(target: str, known: data.Txn) -> None:
    """Raises unless the policy's check rule and the block list decide their calls."""
    for card, what in ((f"{CHECK_PREFIX}-1", "rule check"), (CHECK_CARD, "block list")):
        sample = client.Sample("check", card, known.merchant_id, 1000)
        answer = client.score(target, sample.request(), timeout_s=2.0)
        if answer.decision != pb.DECISION_DECLINE or not any(what in r for r in answer.reasons):
            raise RuntimeError(f"the {what} did not decide its check call: {answer}")


def measure(source: Path, work: Path, variant: str, rnd: int, args: argparse.Namespace) -> Measured:
    """One variant's mesh, started, checked, driven and stopped."""
    state = prepare(source, work / f"round{rnd}-{variant}", variant, args.rules, args.entries)
    sized = sizing.for_cores(sizing.usable_cores())
    replicas = {
        "gateway_replicas": sized.gateway,
        "envoy_replicas": sized.envoy,
        "features_replicas": sized.features,
        "scorer_replicas": sized.scorer,
    }
    mesh = runner.start_mesh(
        state, "sqlite", work / f"logs-{rnd}-{variant}", replicas=replicas, log=lambda _: None
    )
    try:
        population = data.sample_population(state / "data", 2000)
        if variant == "controls":
            check_controls(mesh.config.envoy_target, population[0])
        requests = data.write_data_file(work / "score.json", data.score_requests(population, "now"))
        target = mesh.config.envoy_target
        ghz.run_ghz(ghz.SCORE, target, requests, rps=args.rps, duration_s=5, timeout_ms=42)
        procs = [psutil.Process(p.pid) for p in mesh.processes.values() if p.pid]
        before = sum(sum(p.cpu_times()[:2]) for p in procs)
        result = ghz.run_ghz(
            ghz.SCORE, target, requests, rps=args.rps, duration_s=args.seconds, timeout_ms=42
        )
        cpu_s = sum(sum(p.cpu_times()[:2]) for p in procs) - before
    finally:
        mesh.stop()
    late = sum(1 for c in result.calls if c.status != "OK" or c.latency_ms > 42.0)
    return Measured(
        variant,
        rnd,
        result.count,
        round(result.p50_ms, 2),
        round(result.p99_ms, 2),
        late / result.count if result.count else 1.0,
        round(cpu_s / result.count * 1000, 3) if result.count else 0.0,
    )


def summary(rows: Sequence[Measured]) -> dict[str, object]:
    """Medians per variant over the rounds, and the ratios of controls to plain."""
    medians = {
        v: {
            key: statistics.median(getattr(r, key) for r in rows if r.variant == v)
            for key in ("p50_ms", "p99_ms", "late_share", "cpu_ms_per_score")
        }
        for v in VARIANTS
    }
    return {
        "medians": medians,
        "p99_ratio": round(medians["controls"]["p99_ms"] / medians["plain"]["p99_ms"], 3),
        "cpu_ratio": round(
            medians["controls"]["cpu_ms_per_score"] / medians["plain"]["cpu_ms_per_score"], 3
        ),
    }


def markdown(args: argparse.Namespace, rows: Sequence[Measured], s: dict[str, object]) -> str:
    """The report."""
    medians = s["medians"]
    assert isinstance(medians, dict)
    out = [
        "# The fraud team's controls on the request path, side by side",
        "",
        f"{args.rules} live rules and {args.entries:,} block-list entries (`controls`) against "
        f"no policy and no lists (`plain`), {args.rps} calls/s through Envoy for "
        f"{args.seconds:g} s per mesh, {args.rounds} rounds alternating; no rule or entry "
        "matches the traffic. Late: failed or over 42 ms. CPU: every process of the mesh.",
        "",
        "| round | variant | calls | p50 ms | p99 ms | late | CPU ms/Score |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r.round} | {r.variant} | {r.count} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
        f"{r.late_share:.2%} | {r.cpu_ms_per_score:.2f} |"
        for r in rows
    ]
    out += ["", "| median | p50 ms | p99 ms | late | CPU ms/Score |", "|---|---:|---:|---:|---:|"]
    out += [
        f"| {v} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {m['late_share']:.2%} | "
        f"{m['cpu_ms_per_score']:.2f} |"
        for v, m in medians.items()
    ]
    out += [
        "",
        f"p99 controls / plain: **{s['p99_ratio']:.2f}×**; CPU per Score: "
        f"**{s['cpu_ratio']:.2f}×** (medians over the rounds).",
        "",
    ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the rounds and writes the report."""
    parser = argparse.ArgumentParser(prog="python -m loadtest.controls_bench")
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=runner.RESULTS_DIR)
    parser.add_argument("--rules", type=int, default=100)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rps", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rules < 1 or args.entries < 1 or args.rounds < 1:
        parser.error("--rules, --entries and --rounds must be at least 1")
    runner.check_state(args.var_dir)
    work = Path(tempfile.mkdtemp(prefix="controls-bench-"))
    rows: list[Measured] = []
    try:
        for rnd in range(1, args.rounds + 1):
            order = VARIANTS if rnd % 2 else tuple(reversed(VARIANTS))
            for variant in order:
                print(f"round {rnd}: {variant} …", flush=True)
                rows.append(measure(args.var_dir, work, variant, rnd, args))
                print(f"  {rows[-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = summary(rows)
    prov = provenance.record(" ".join(["python -m loadtest.controls_bench", *sys.argv[1:]]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "controls-bench.md").write_text(provenance.markdown(markdown(args, rows, s), prov))
    payload = {"provenance": prov.as_json(), "rows": [asdict(r) for r in rows], "summary": s}
    (args.out / "controls-bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(markdown(args, rows, s))


if __name__ == "__main__":
    main()
