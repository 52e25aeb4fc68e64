"""Side-by-side load tests: variants of the mesh taking turns in one session.

``fraudmesh loadtest --compare NAME:KEY=VALUE[,KEY=VALUE…] --compare … [--rounds 3]`` runs two
or more variants of the mesh, each given by environment settings for its service processes
(e.g. ``unary:FRAUD_GATEWAY_TRANSPORT=unary``), on the same store, rates and request mix.
Each round starts, for every variant in turn, a fresh mesh on a fresh copy of the state
(dataset, registry, online store, models; no live-loop state left by an earlier run), warms
it up, runs the rate steps and stops it; only one mesh runs at a time. The variants' order
rotates from round to round (a, b; then b, a; …) so that the shared machine's drift falls
on every variant alike. Every figure is then also given as the median over the rounds, and
each variant's medians against the first variant's (the baseline): p99 and CPU per Score.

Results go to ``loadtest/results/compare-<store>-<a>-vs-<b>.md``, ``.json`` and ``.png``.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from loadtest import data, provenance, report, runner
from services.common.edge_security import EdgeSettings
from services.common.settings import from_mapping
from services.decisionlog.settings import DecisionLogSettings
from services.eventlog.settings import EventLogSettings
from services.features.settings import FeaturesSettings
from services.featurestore.settings import FeatureStoreSettings
from services.gateway.settings import GatewaySettings
from services.scorer.settings import ScorerSettings
from services.updater.settings import UpdaterSettings

Log = Callable[[str], None]

SERVICE_SETTINGS: tuple[type[BaseSettings], ...] = (
    GatewaySettings,
    FeaturesSettings,
    FeatureStoreSettings,
    ScorerSettings,
    UpdaterSettings,
    DecisionLogSettings,
    EventLogSettings,
    EdgeSettings,
)
"""Settings classes the mesh's service processes (and its Envoy: ``FRAUD_EDGE_*``) build
from their environment."""
SERVING = ("envoy", "gateway", "features", "scorer", "redis")
"""Processes on the request path (and gateway replicas, ``gateway-N``); the others (the live
loop's updater and decision sink) work after the answer."""
PRODUCT_PREFIX = "FRAUD_"
"""Environment names under this prefix must name a setting of ``SERVICE_SETTINGS``."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NEXT_PAIR = re.compile(r",(?=[A-Za-z_][A-Za-z0-9_]*=)")


REPLICA_KEYS = ("gateway_replicas", "envoy_replicas", "features_replicas", "scorer_replicas")
"""Variant keys that shape the mesh rather than set an environment variable: how many
processes of each replicated part it runs (e.g. ``one:gateway_replicas=1,envoy_replicas=1``)."""


@dataclass(frozen=True)
class Variant:
    """One side of the comparison: a name, the environment its service processes get, and
    the replicas it runs (``REPLICA_KEYS``; unset: the load test's own)."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    replicas: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``NAME:KEY=VALUE[,KEY=VALUE…]``, or ``NAME`` alone for the mesh as configured.

        A comma starts a new pair only where ``KEY=`` follows it, so values may hold commas.
        """
        name, _, rest = text.partition(":")
        name = name.strip()
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"variant name {name!r}: use letters, digits, '.', '_' or '-' (it names files)"
            )
        env: dict[str, str] = {}
        replicas: dict[str, int] = {}
        for pair in _NEXT_PAIR.split(rest.strip()) if rest.strip() else []:
            key, sep, value = pair.partition("=")
            key = key.strip()
            if not sep or not _KEY.fullmatch(key):
                raise ValueError(f"{name}: {pair!r} is not KEY=VALUE")
            if key in env or key in replicas:
                raise ValueError(f"{name}: {key} given twice")
            if key in REPLICA_KEYS:
                if not value.strip().isdigit() or not 1 <= int(value) <= 9:
                    raise ValueError(f"{name}: {key} must be a count from 1 to 9, got {value!r}")
                replicas[key] = int(value)
            else:
                env[key] = value
        return cls(name, env, replicas)

    def describe(self) -> str:
        """The replicas and environment as ``KEY=VALUE`` pairs, or a note that it has none."""
        pairs = [*self.replicas.items(), *self.env.items()]
        return ", ".join(f"`{k}={v}`" for k, v in pairs) or "(none: as configured)"


def check_env(env: Mapping[str, str]) -> None:
    """Fails on a product setting no service knows (a typo would compare two alike meshes)
    or a value its settings class rejects; other names (``PYTHON…``, ``GRPC_…``) pass."""
    for key in env:
        if not key.upper().startswith(PRODUCT_PREFIX):
            continue
        owners = [
            cls
            for cls in SERVICE_SETTINGS
            if key.upper().startswith(str(cls.model_config.get("env_prefix", "")).upper())
        ]
        known = any(
            key.upper().removeprefix(str(cls.model_config.get("env_prefix", "")).upper()).lower()
            in cls.model_fields
            for cls in owners
        )
        if not known:
            names = ", ".join(c.__name__ for c in owners) or "no service's settings"
            raise ValueError(f"{key} is not a setting of {names}")
    for cls in SERVICE_SETTINGS:
        try:
            from_mapping(cls, env)
        except ValidationError as error:
            raise ValueError(f"{cls.__name__} rejects the environment: {error}") from error


def check_variants(variants: Sequence[Variant]) -> None:
    """Fails unless there are two or more variants with distinct names and valid settings."""
    if len(variants) < 2:
        raise ValueError("give two or more variants to compare")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must differ: {names}")
    for variant in variants:
        try:
            check_env(variant.env)
        except ValueError as error:
            raise ValueError(f"{variant.name}: {error}") from error


def rotation(variants: Sequence[Variant], round_index: int) -> list[Variant]:
    """The variants' order in round ``round_index`` (from 0): rotated by one each round."""
    shift = round_index % len(variants)
    return [*variants[shift:], *variants[:shift]]


@dataclass(frozen=True)
class CompareConfig:
    """What one side-by-side session runs: the load test's settings, shared by every
    variant, the variants (the first is the baseline) and the rounds."""

    base: runner.LoadtestConfig
    variants: Sequence[Variant]
    rounds: int = 3
    command: str = ""
    """How the session was started, for the report."""

    @property
    def report_name(self) -> str:
        """Base name of the report files."""
        if self.base.name:
            return self.base.name
        names = "-vs-".join(v.name for v in self.variants)
        return "-".join(filter(None, ("compare", self.base.store, self.base.variant, names)))


@dataclass(frozen=True)
class Run:
    """One variant's rate steps in one round, on its own fresh mesh."""

    variant: str
    round: int
    position: int
    """Its place in the round's order, from 1."""
    steps: list[report.Step]
    processes: list[str]


@dataclass(frozen=True)
class CompareReport:
    """The runs a session made and the files it wrote."""

    runs: list[Run]
    summary: dict[str, Any]
    markdown: Path
    plot: Path
    json: Path


def _cell(run: Run, step: report.Step) -> dict[str, Any]:
    """One run's figures at one rate."""
    r = step.result
    return {
        "round": run.round,
        "position": run.position,
        "achieved_rps": r.achieved_rps,
        "count": r.count,
        "p50_ms": r.p50_ms,
        "p90_ms": r.p90_ms,
        "p99_ms": r.p99_ms,
        "p999_ms": r.p999_ms,
        "error_share": r.error_share,
        "errors": dict(r.error_shares()),
        "default_share": step.share("feature_source=default"),
        "partial_share": step.share("feature_source=partial"),
        "rules_share": step.share("scored_by=rules"),
        "small_model_share": step.share("scored_by=small_model"),
        "first_stage_share": step.share("scored_by=first_stage"),
        "cpu_ms_per_call": step.cpu_ms,
        "serving_cpu_ms_per_call": sum(
            v for n, v in step.cpu_ms_per_call.items() if n.split("-")[0] in SERVING
        ),
        "cpu_by_process": dict(step.cpu_ms_per_call),
        "rss_mb_by_process": {n: b / 2**20 for n, b in step.peak_rss.items()},
        "full_quality": step.full_quality(),
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(new: float | None, old: float | None) -> float | None:
    return new / old if new is not None and old else None


MEDIAN_KEYS = (
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p999_ms",
    "error_share",
    "default_share",
    "partial_share",
    "rules_share",
    "small_model_share",
    "first_stage_share",
    "cpu_ms_per_call",
    "serving_cpu_ms_per_call",
)
"""Figures of a cell that get a median over the rounds."""


def summarize(
    runs: Sequence[Run], variants: Sequence[Variant], rates: Sequence[int], rounds: int
) -> dict[str, Any]:
    """Per rate and variant: every round's cell and the medians over the rounds that ran
    the rate; each variant's median p99 and CPU per Score over the baseline's; per variant
    the highest rate at full quality in each round, in every round and its median."""
    baseline = variants[0].name
    per_rate: list[dict[str, Any]] = []
    for rps in rates:
        entry: dict[str, Any] = {"offered_rps": rps, "variants": {}, "versus_baseline": {}}
        for variant in variants:
            cells = [
                _cell(run, step)
                for run in runs
                if run.variant == variant.name
                for step in run.steps
                if abs(step.result.offered_rps - rps) < 0.5
            ]
            if not cells:
                continue
            medians: dict[str, Any] = {k: _median([c[k] for c in cells]) for k in MEDIAN_KEYS}
            processes = sorted({n for c in cells for n in c["cpu_by_process"]})
            medians["cpu_by_process"] = {
                n: _median([c["cpu_by_process"].get(n) for c in cells]) for n in processes
            }
            # Replicas cost memory above all: the peak RSS of each process, and of them all.
            rss = [c.get("rss_mb_by_process", {}) for c in cells]
            medians["rss_mb_by_process"] = {
                n: _median([r.get(n) for r in rss]) for n in sorted({n for r in rss for n in r})
            }
            medians["rss_mb"] = _median([sum(r.values()) if r else None for r in rss])
            entry["variants"][variant.name] = {
                "rounds_run": len(cells),
                "rounds_full_quality": sum(c["full_quality"] for c in cells),
                "any_errors": any(c["error_share"] > 0 for c in cells),
                "cells": cells,
                "median": medians,
            }
        base = entry["variants"].get(baseline)
        for name, cell in entry["variants"].items():
            if name == baseline or base is None:
                continue
            entry["versus_baseline"][name] = {
                "p99": _ratio(cell["median"]["p99_ms"], base["median"]["p99_ms"]),
                "cpu_ms_per_call": _ratio(
                    cell["median"]["cpu_ms_per_call"], base["median"]["cpu_ms_per_call"]
                ),
                "serving_cpu_ms_per_call": _ratio(
                    cell["median"]["serving_cpu_ms_per_call"],
                    base["median"]["serving_cpu_ms_per_call"],
                ),
            }
        per_rate.append(entry)
    full: dict[str, Any] = {}
    for variant in variants:
        by_round: list[float | None] = []
        for rnd in range(1, rounds + 1):
            run = next((r for r in runs if r.variant == variant.name and r.round == rnd), None)
            best = report.max_full_quality(run.steps) if run is not None else None
            by_round.append(best.result.offered_rps if best is not None else None)
        reached = [v or 0.0 for v in by_round]
        full[variant.name] = {
            "by_round": by_round,
            "every_round": min(reached) if reached else 0.0,
            "median": statistics.median(reached) if reached else 0.0,
        }
    return {"baseline": baseline, "rates": per_rate, "full_quality": full}


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _rate(value: float | None) -> str:
    return f"{value:.0f} rps" if value else "none"


def _degraded(median: Mapping[str, float | None]) -> bool:
    """Medians beyond full quality: degraded answers skip work, so they cost less."""
    return (
        (median["default_share"] or 0) >= report.MAX_DEFAULT_SHARE
        or (median["rules_share"] or 0) >= report.MAX_RULES_SHARE
        or (median["small_model_share"] or 0) >= report.MAX_SMALL_MODEL_SHARE
    )


def markdown(cfg: CompareConfig, summary: Mapping[str, Any], started: datetime, png: Path) -> str:
    """The report: variants and method, medians with ratios, full quality, every run, CPU."""
    base, baseline = cfg.base, summary["baseline"]
    names = [v.name for v in cfg.variants]
    first_two = ", ".join(v.name for v in rotation(cfg.variants, 0))
    then = ", ".join(v.name for v in rotation(cfg.variants, 1))
    lines = [
        f"# Side by side: {' vs '.join(names)} ({base.store} store"
        + (f", {base.variant}" if base.variant else "")
        + ")",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC; {runner.machine_line()}.",
    ]
    if cfg.command:
        lines += ["", f"`{cfg.command}`"]
    lines += [
        "",
        "| variant | environment of every service process |",
        "|---|---|",
        *(f"| {v.name} | {v.describe()} |" for v in cfg.variants),
        "",
        f"{cfg.rounds} round{'s' if cfg.rounds > 1 else ''}. In each, every variant in turn "
        "gets a fresh mesh on a fresh copy of the state (dataset, registry, online store, "
        f"models; no live-loop state from an earlier run), {base.warmup_s:g} s of warm-up at "
        "the first rate, then the rate steps: "
        f"ghz open loop (`--async --count-errors`), {base.step_s:g} s per step, deadline "
        f"{base.deadline_ms:g} ms per call, {base.requests} distinct requests; a run stops "
        f"after {base.saturated_steps} saturated steps in a row. One mesh runs at a time; the "
        f"order rotates every round (round 1: {first_two}; round 2: {then}; …) so that the "
        "machine's drift falls on each variant alike. "
        + (
            "Live loop on (decision events, feature updater, decision sink). "
            if base.live_loop
            else "Live loop off. "
        )
        + "Percentiles include errors. *Default*, *partial*, *rules*, *small*: shares of "
        "answers made with default or partial features, by the rules or by the small model "
        "standing in for the model (degraded); *first stage*: approved by the cascade's first "
        "stage without the scorer (full quality); from the gateway's decision counters. "
        "*CPU ms/Score*: user + system CPU of every process of the mesh (Envoy, the services, "
        "the loop's consumers, Redis) over the step, per call made; *serving*: of the "
        "processes on the request path alone (Envoy, gateways, features, scorer, Redis; the "
        "loop's consumers work after the answer and, at low rates, mostly on their own "
        "timers). Ratios are the variant's "
        f"median over {baseline}'s; † marks a median with degraded answers beyond full quality "
        "(they skip work, so they cost less and can answer sooner).",
        "",
        "## Medians over the rounds",
        "",
        "| offered rps | variant | rounds | p50 ms | p99 ms | p99.9 ms | errors | default "
        "| partial | rules | small | first stage | CPU ms/Score | serving | full quality "
        f"| p99 vs {baseline} | CPU vs {baseline} | serving vs {baseline} |",
        "|---:|---|" + "---:|" * 16,
    ]
    for entry in summary["rates"]:
        for name, cell in entry["variants"].items():
            m = cell["median"]
            versus = entry["versus_baseline"].get(name, {})
            lines.append(
                f"| {entry['offered_rps']} | {name}{' †' if _degraded(m) else ''} "
                f"| {cell['rounds_run']}/{cfg.rounds} | {_ms(m['p50_ms'])} | {_ms(m['p99_ms'])} "
                f"| {_ms(m['p999_ms'])} | {_pct(m['error_share'])} | {_pct(m['default_share'])} "
                f"| {_pct(m['partial_share'])} | {_pct(m['rules_share'])} "
                f"| {_pct(m['small_model_share'])} | {_pct(m['first_stage_share'])} "
                f"| {_ms(m['cpu_ms_per_call'])} | {_ms(m['serving_cpu_ms_per_call'])} "
                f"| {cell['rounds_full_quality']}/{cell['rounds_run']} | "
                + " | ".join(
                    "base" if name == baseline else _times(versus.get(key))
                    for key in ("p99", "cpu_ms_per_call", "serving_cpu_ms_per_call")
                )
                + " |"
            )
    lines += [
        "",
        "## Highest rate at full quality",
        "",
        f"0 errors, p99 ≤ {report.BUDGET_MS:g} ms, under {report.MAX_RULES_SHARE:.0%} of the "
        f"answers by the rules, under {report.MAX_SMALL_MODEL_SHARE:.0%} by the small model "
        "standing in for the model (first-stage approvals are full quality) and under "
        f"{report.MAX_DEFAULT_SHARE:.0%} with default features; of the rates run.",
        "",
        "| variant | "
        + " | ".join(f"round {i}" for i in range(1, cfg.rounds + 1))
        + " | in every round | median |",
        "|---|" + "---:|" * (cfg.rounds + 2),
    ]
    for name, full in summary["full_quality"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(_rate(v) for v in full["by_round"])
            + f" | {_rate(full['every_round'])} | {_rate(full['median'])} |"
        )
    lines += [
        "",
        "## Every run",
        "",
        "| offered rps | variant | round (turn) | achieved rps | p50 ms | p99 ms | p99.9 ms "
        "| errors | default | partial | rules | small | first stage | CPU ms/Score | serving |",
        "|---:|---|" + "---:|" * 13,
    ]
    for entry in summary["rates"]:
        for name, cell in entry["variants"].items():
            for c in cell["cells"]:
                errors = f"{c['error_share']:.2%}"
                if c["errors"]:
                    errors += " (" + ", ".join(f"{k} {v:.1%}" for k, v in c["errors"].items()) + ")"
                lines.append(
                    f"| {entry['offered_rps']} | {name} | {c['round']} ({c['position']}) "
                    f"| {c['achieved_rps']:.0f} | {_ms(c['p50_ms'])} | {_ms(c['p99_ms'])} "
                    f"| {_ms(c['p999_ms'])} | {errors} | {_pct(c['default_share'])} "
                    f"| {_pct(c['partial_share'])} | {_pct(c['rules_share'])} "
                    f"| {_pct(c['small_model_share'])} | {_pct(c['first_stage_share'])} "
                    f"| {_ms(c['cpu_ms_per_call'])} | {_ms(c['serving_cpu_ms_per_call'])} |"
                )
    processes = sorted(
        {
            n
            for entry in summary["rates"]
            for cell in entry["variants"].values()
            for n in cell["median"]["cpu_by_process"]
        }
    )
    lines += [
        "",
        "## CPU ms per Score by process (medians)",
        "",
        "| offered rps | variant | " + " | ".join(processes) + " | all |",
        "|---:|---|" + "---:|" * (len(processes) + 1),
    ]
    for entry in summary["rates"]:
        for name, cell in entry["variants"].items():
            per = cell["median"]["cpu_by_process"]
            lines.append(
                f"| {entry['offered_rps']} | {name} | "
                + " | ".join(_ms(per.get(n)) for n in processes)
                + f" | {_ms(cell['median']['cpu_ms_per_call'])} |"
            )
    held = sorted(
        {
            n
            for entry in summary["rates"]
            for cell in entry["variants"].values()
            for n in cell["median"].get("rss_mb_by_process", {})
        }
    )
    if held:
        lines += [
            "",
            "## Peak RSS MB by process (medians)",
            "",
            "| offered rps | variant | " + " | ".join(held) + " | all |",
            "|---:|---|" + "---:|" * (len(held) + 1),
        ]
        for entry in summary["rates"]:
            for name, cell in entry["variants"].items():
                per = cell["median"].get("rss_mb_by_process", {})
                total = cell["median"].get("rss_mb")
                lines.append(
                    f"| {entry['offered_rps']} | {name} | "
                    + " | ".join("–" if per.get(n) is None else f"{per[n]:.0f}" for n in held)
                    + f" | {'–' if total is None else f'{total:.0f}'} |"
                )
    lines += ["", f"![medians and each run's p99, degraded answers, vs rate]({png.name})", ""]
    return "\n".join(lines)


def median_points(summary: Mapping[str, Any]) -> dict[str, list[report.Point]]:
    """Each variant's medians per rate as plot points (circled when any round had errors)."""
    series: dict[str, list[report.Point]] = {}
    for entry in summary["rates"]:
        for name, cell in entry["variants"].items():
            m = cell["median"]
            shares = {
                key: m[figure]
                for key, figure in (
                    ("feature_source=default", "default_share"),
                    ("feature_source=partial", "partial_share"),
                    ("scored_by=rules", "rules_share"),
                    ("scored_by=small_model", "small_model_share"),
                )
                if m[figure] is not None
            }
            series.setdefault(name, []).append(
                report.Point(
                    entry["offered_rps"],
                    m["p50_ms"],
                    m["p90_ms"],
                    m["p99_ms"],
                    m["p999_ms"],
                    cell["any_errors"],
                    shares,
                )
            )
    return series


def write_report(cfg: CompareConfig, runs: Sequence[Run], started: datetime) -> CompareReport:
    """Writes the Markdown report, the plot and the JSON of a session."""
    base = cfg.base
    out = base.out_dir
    out.mkdir(parents=True, exist_ok=True)
    name = cfg.report_name
    summary = summarize(runs, cfg.variants, base.rates, cfg.rounds)
    png = report.plot(
        median_points(summary),
        out / f"{name}.png",
        f"{' vs '.join(v.name for v in cfg.variants)} ({base.store} store): "
        f"medians over {cfg.rounds} round{'s' if cfg.rounds > 1 else ''}",
        percentiles=("p50", "p99", "p99.9"),
        spread={
            v.name: [s for r in runs if r.variant == v.name for s in r.steps] for v in cfg.variants
        },
    )
    md = out / f"{name}.md"
    prov = provenance.record(cfg.command)
    md.write_text(provenance.markdown(markdown(cfg, summary, started, png), prov))
    summary_path = out / f"{name}.json"
    summary_path.write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "command": cfg.command,
                "started": started.isoformat(),
                "machine": runner.machine_line(),
                "store": base.store,
                "mesh": base.variant or "as designed",
                "live_loop": base.live_loop,
                "rates": list(base.rates),
                "rounds": cfg.rounds,
                "step_s": base.step_s,
                "warmup_s": base.warmup_s,
                "deadline_ms": base.deadline_ms,
                "variants": [
                    {"name": v.name, "env": dict(v.env)}
                    | ({"replicas": dict(v.replicas)} if v.replicas else {})
                    for v in cfg.variants
                ],
                "runs": [
                    {
                        "variant": r.variant,
                        "round": r.round,
                        "position": r.position,
                        "processes": r.processes,
                        "steps": [s.to_dict() for s in r.steps],
                    }
                    for r in runs
                ],
                "summary": summary,
            },
            indent=2,
        )
    )
    return CompareReport(list(runs), summary, md, png, summary_path)


def run(cfg: CompareConfig, log: Log = print) -> CompareReport:
    """Runs every round (a fresh mesh per variant, in rotating order) and writes the report;
    a failed run stops the session and keeps its logs."""
    base = cfg.base
    if base.target is not None:
        raise ValueError("a comparison starts its own meshes: give no target")
    check_variants(cfg.variants)
    runner.check_state(base.var_dir)
    started = datetime.now(UTC)
    work = base.out_dir / f".{cfg.report_name}.tmp"
    population = data.sample_population(base.var_dir / "data", base.requests)
    requests = runner.request_source(population, work / "score.json")
    runs: list[Run] = []
    for index in range(cfg.rounds):
        for position, variant in enumerate(rotation(cfg.variants, index), 1):
            home = work / f"round{index + 1}-{variant.name}"
            if home.exists():
                shutil.rmtree(home)
            log(
                f"round {index + 1}/{cfg.rounds}, {variant.name} ({position} of "
                f"{len(cfg.variants)}): fresh {base.store} mesh, {variant.describe()} …"
            )
            state = runner.copy_state(base.var_dir, home / "var")
            try:
                steps, processes = runner.measure_mesh(
                    base,
                    state,
                    home,
                    requests,
                    extra_env=variant.env,
                    replicas=variant.replicas,
                    log=log,
                )
            except RuntimeError as error:
                raise RuntimeError(
                    f"{variant.name}, round {index + 1}: {error} (logs in {home / 'logs'})"
                ) from error
            runs.append(Run(variant.name, index + 1, position, steps, processes))
            shutil.rmtree(home)
    result = write_report(cfg, runs, started)
    shutil.rmtree(work, ignore_errors=True)
    return result
