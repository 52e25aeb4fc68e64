"""Markdown tables and PNG plots of load-test steps."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loadtest.ghz import Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes

BUDGET_MS = 42.0
"""The end-to-end budget every plot marks."""
MAX_DEFAULT_SHARE = 0.05
"""Full quality: fewer answers than this share made with default features."""
MAX_RULES_SHARE = 0.01
"""Full quality: fewer answers than this share made by the rules."""
MAX_SMALL_MODEL_SHARE = 0.01
"""Full quality: fewer answers than this share made by the small model standing in for the
model (its first-stage approvals are full quality: the cascade is the version's behaviour)."""
DEGRADED: dict[str, str] = {
    "feature_source=default": "default features",
    "feature_source=partial": "partial features",
    "scored_by=rules": "by rules",
    "scored_by=small_model": "by the small model",
}
"""Degraded (yet not failed) answers, by the gateway's decision-counter key, and their names."""


@dataclass(frozen=True)
class Step:
    """One rate step: what ghz measured and the peak RSS (bytes) of each process meanwhile."""

    result: Result
    peak_rss: Mapping[str, int] = field(default_factory=dict)
    cpu_ms_per_call: Mapping[str, float] = field(default_factory=dict)
    """CPU time (user + system) each process spent during the step, per call made."""
    answers: Mapping[str, float] = field(default_factory=dict)
    """The gateway's answers during the step by how they were made (``scored_by=model``,
    ``feature_source=default``, …, from its decision counter); empty when not scraped."""

    def share(self, key: str) -> float | None:
        """Share of the step's answers counted under ``key`` (None when not scraped)."""
        total = sum(v for k, v in self.answers.items() if k.startswith("scored_by="))
        return self.answers.get(key, 0.0) / total if total else None

    def shares(self) -> dict[str, float]:
        """Share of each kind of degraded answer (``DEGRADED``'s keys); empty when not scraped."""
        out = {key: self.share(key) for key in DEGRADED}
        return {key: value for key, value in out.items() if value is not None}

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds of all the measured processes per call."""
        return sum(self.cpu_ms_per_call.values())

    def full_quality(self, p99_ms: float = BUDGET_MS) -> bool:
        """No errors, p99 within ``p99_ms`` and answers known to be at full quality: under
        ``MAX_DEFAULT_SHARE`` with default features, under ``MAX_RULES_SHARE`` by the rules and
        under ``MAX_SMALL_MODEL_SHARE`` by the small model standing in for the model."""
        default, rules = self.share("feature_source=default"), self.share("scored_by=rules")
        small = self.share("scored_by=small_model")
        return (
            self.result.ok(p99_ms)
            and default is not None
            and rules is not None
            and small is not None
            and default < MAX_DEFAULT_SHARE
            and rules < MAX_RULES_SHARE
            and small < MAX_SMALL_MODEL_SHARE
        )

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary: ghz's figures, peak RSS (MB), CPU per call and answer shares."""
        return {
            **self.result.to_dict(),
            "peak_rss_mb": {k: round(v / 2**20, 1) for k, v in self.peak_rss.items()},
            "cpu_ms_per_call": {k: round(v, 4) for k, v in self.cpu_ms_per_call.items()},
            "answers": dict(self.answers),
            "degraded_shares": self.shares(),
        }


@dataclass(frozen=True)
class Point:
    """One point of a plot: percentiles (ms) at an offered rate, whether calls failed, and
    the degraded answers' shares when known (a step, or medians over several)."""

    offered_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    errors: bool = False
    shares: Mapping[str, float] = field(default_factory=dict)
    """Share of answers by ``DEGRADED`` key (0..1); empty when not known."""

    @classmethod
    def of(cls, item: Result | Step | Point) -> Point:
        """The point of a ghz result, a step (with its shares) or a point."""
        if isinstance(item, Point):
            return item
        result = item.result if isinstance(item, Step) else item
        return cls(
            result.offered_rps,
            result.p50_ms,
            result.p90_ms,
            result.p99_ms,
            result.p999_ms,
            result.error_count > 0,
            item.shares() if isinstance(item, Step) else {},
        )

    def latency(self, name: str) -> float:
        """The percentile named ``p50``, ``p90``, ``p99`` or ``p99.9``."""
        return {"p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms, "p99.9": self.p999_ms}[
            name
        ]


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _share(result: Result) -> str:
    if result.error_count == 0:
        return "0"
    parts = ", ".join(f"{code} {share:.1%}" for code, share in result.error_shares().items())
    return f"{result.error_share:.2%} ({parts})"


def steps_table(steps: Sequence[Step], processes: Sequence[str] = ()) -> str:
    """Markdown table: offered/achieved rps, p50/p90/p99/p99.9 (ms), error share, CPU time
    of all the processes per call, degraded answers (when known: by the rules or the small
    model, with default or partial features), the cascade's first-stage approvals, peak RSS
    (MB)."""
    head = ["offered rps", "achieved rps", "calls", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms"]
    degraded = any(step.answers for step in steps)
    head += ["errors"]
    cpu = any(step.cpu_ms_per_call for step in steps)
    if cpu:
        head += ["CPU ms/call"]
    if degraded:
        head += ["by rules", "by small model", "default features", "partial features"]
        head += ["first stage"]
    head += [f"{p} MB" for p in processes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for step in steps:
        r = step.result
        cells = [
            f"{r.offered_rps:.0f}",
            f"{r.achieved_rps:.0f}",
            str(r.count),
            _ms(r.p50_ms),
            _ms(r.p90_ms),
            _ms(r.p99_ms),
            _ms(r.p999_ms),
            _share(r),
        ]
        if cpu:
            cells.append(f"{step.cpu_ms:.2f}")
        if degraded:
            for key in (*_TABLE_DEGRADED, "scored_by=first_stage"):
                value = step.share(key)
                cells.append("n/a" if value is None else f"{value:.1%}")
        cells += [f"{step.peak_rss.get(p, 0) / 2**20:.0f}" for p in processes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_TABLE_DEGRADED = (
    "scored_by=rules",
    "scored_by=small_model",
    "feature_source=default",
    "feature_source=partial",
)


def cpu_table(steps: Sequence[Step]) -> str:
    """Markdown table of each process's CPU milliseconds per call, by step."""
    names = sorted({n for s in steps for n in s.cpu_ms_per_call})
    lines = ["| offered rps | " + " | ".join(names) + " | all |", "|" + "---:|" * (len(names) + 2)]
    for step in steps:
        cpu = step.cpu_ms_per_call
        cells = [f"{cpu.get(n, 0.0):.2f}" for n in names]
        lines.append(
            f"| {step.result.offered_rps:.0f} | "
            + " | ".join(cells)
            + f" | {sum(cpu.values()):.2f} |"
        )
    return "\n".join(lines)


def max_sustainable(results: Sequence[Result], p99_ms: float = BUDGET_MS) -> Result | None:
    """The highest-rate step with no errors and p99 within ``p99_ms`` (None if none)."""
    good = [r for r in results if r.ok(p99_ms)]
    return max(good, key=lambda r: r.offered_rps) if good else None


def max_full_quality(steps: Sequence[Step], p99_ms: float = BUDGET_MS) -> Step | None:
    """The highest-rate step at full quality (``Step.full_quality``), or None if none."""
    good = [s for s in steps if s.full_quality(p99_ms)]
    return max(good, key=lambda s: s.result.offered_rps) if good else None


def at_rate(results: Sequence[Result], rps: float) -> Result | None:
    """The step run at ``rps`` offered, if any."""
    for r in results:
        if abs(r.offered_rps - rps) < 0.5:
            return r
    return None


def plot(
    series: Mapping[str, Sequence[Result | Step | Point]],
    path: Path,
    title: str,
    budget_ms: float | None = BUDGET_MS,
    *,
    percentiles: Sequence[str] = ("p50", "p90", "p99", "p99.9"),
    spread: Mapping[str, Sequence[Result | Step | Point]] | None = None,
) -> Path:
    """PNG of ``percentiles`` (of p50, p90, p99, p99.9) versus offered rate, one colour per
    series, log latency axis, the budget as a dashed line and steps with errors circled in red.

    When any point knows its answers, a second panel below shows per offered rate the share
    of calls that failed and of answers made with default or partial features, by the rules
    or by the small model standing in for the model, with the full-quality limits: a degraded answer skips work, so a p50 that falls
    at saturation is not speed. ``spread`` adds each series' single runs (e.g. every round
    behind a median) as small p99 markers."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = {
        label: sorted((Point.of(i) for i in items), key=lambda p: p.offered_rps)
        for label, items in series.items()
    }
    degraded = any(p.shares for ps in points.values() for p in ps)
    ax: Axes
    if degraded:
        fig, (ax, ax_share) = plt.subplots(
            2, 1, figsize=(9, 8), dpi=110, sharex=True, gridspec_kw={"height_ratios": [3, 1.6]}
        )
    else:
        fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    styles = {
        name: style
        for name, style in {"p50": "-", "p90": "--", "p99": "-.", "p99.9": ":"}.items()
        if name in percentiles
    }
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    many = len(points) > 1
    for index, (label, ordered) in enumerate(points.items()):
        x = [p.offered_rps for p in ordered]
        colour = colours[index % len(colours)]
        prefix = f"{label} " if many else ""
        for name, style in styles.items():
            y = [p.latency(name) for p in ordered]
            ax.plot(x, y, style, marker="o", ms=3, color=colour, label=f"{prefix}{name}")
        runs = [Point.of(i) for i in (spread or {}).get(label, ())]
        if runs:
            ax.scatter(
                [p.offered_rps for p in runs],
                [p.p99_ms for p in runs],
                s=14,
                marker="x",
                color=colour,
                alpha=0.6,
                label=f"{prefix}p99 of each run",
                zorder=4,
            )
        bad = [p for p in ordered if p.errors]
        if bad:
            ax.scatter(
                [p.offered_rps for p in bad],
                [p.p99_ms for p in bad],
                s=90,
                facecolors="none",
                edgecolors="red",
                label="errors" if index == 0 else None,
                zorder=5,
            )
    if budget_ms is not None:
        ax.axhline(budget_ms, color="red", lw=1.2, ls="--", label=f"{budget_ms:g} ms budget")
    ax.set_yscale("log")
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

    low, high = ax.get_ylim()
    ticks = [
        t for t in (0.5, 1, 2, 3, 5, 10, 20, 30, 42, 60, 100, 200, 500, 1000) if low <= t <= high
    ]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if many else 1, loc="best", framealpha=0.85)
    bottom = ax
    if degraded:
        _plot_shares(ax_share, points, colours)
        bottom = ax_share
    bottom.set_xlabel("offered rate (requests/s, open loop)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot_shares(ax: Axes, points: Mapping[str, Sequence[Point]], colours: Sequence[str]) -> None:
    """The degraded-answer panel: share (%) of each kind per offered rate, limits dashed."""
    kinds = {
        "feature_source=default": ("-", "s"),
        "feature_source=partial": ("--", "^"),
        "scored_by=rules": (":", "x"),
        "scored_by=small_model": ("-.", "d"),
    }
    many = len(points) > 1
    top = 0.0
    for index, (label, ordered) in enumerate(points.items()):
        known = [p for p in ordered if p.shares]
        if not known:
            continue
        colour = colours[index % len(colours)]
        x = [p.offered_rps for p in known]
        for key, (style, marker) in kinds.items():
            y = [100 * p.shares.get(key, 0.0) for p in known]
            top = max(top, *y)
            name = f"{label} {DEGRADED[key]}" if many else DEGRADED[key]
            ax.plot(x, y, style, marker=marker, ms=4, color=colour, label=name)
    ax.axhline(100 * MAX_DEFAULT_SHARE, color="grey", lw=1, ls="--")
    ax.axhline(100 * MAX_RULES_SHARE, color="grey", lw=1, ls=":")
    ax.text(
        0.005,
        100 * MAX_DEFAULT_SHARE,
        f" full quality: < {MAX_DEFAULT_SHARE:.0%} default features, < {MAX_RULES_SHARE:.0%} "
        f"rules, < {MAX_SMALL_MODEL_SHARE:.0%} small model",
        transform=ax.get_yaxis_transform(),
        fontsize=7,
        color="grey",
        va="bottom",
    )
    ax.set_ylim(0, max(10.0, top * 1.1))
    ax.set_ylabel("degraded answers (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=3 if many else 1, loc="upper left", framealpha=0.85)
