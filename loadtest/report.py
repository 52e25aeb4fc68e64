"""Markdown tables and PNG plots of load-test steps."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.ghz import Result

BUDGET_MS = 42.0
"""The end-to-end budget every plot marks."""


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


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _share(result: Result) -> str:
    if result.error_count == 0:
        return "0"
    parts = ", ".join(f"{code} {share:.1%}" for code, share in result.error_shares().items())
    return f"{result.error_share:.2%} ({parts})"


def steps_table(steps: Sequence[Step], processes: Sequence[str] = ()) -> str:
    """Markdown table: offered/achieved rps, p50/p90/p99/p99.9 (ms), error share, CPU time
    of all the processes per call, degraded answers (when known), peak RSS (MB)."""
    head = ["offered rps", "achieved rps", "calls", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms"]
    degraded = any(step.answers for step in steps)
    head += ["errors"]
    cpu = any(step.cpu_ms_per_call for step in steps)
    if cpu:
        head += ["CPU ms/call"]
    if degraded:
        head += ["by rules", "default features"]
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
            cells.append(f"{sum(step.cpu_ms_per_call.values()):.2f}")
        if degraded:
            for key in ("scored_by=rules", "feature_source=default"):
                value = step.share(key)
                cells.append("n/a" if value is None else f"{value:.1%}")
        cells += [f"{step.peak_rss.get(p, 0) / 2**20:.0f}" for p in processes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def at_rate(results: Sequence[Result], rps: float) -> Result | None:
    """The step run at ``rps`` offered, if any."""
    for r in results:
        if abs(r.offered_rps - rps) < 0.5:
            return r
    return None


def plot(
    series: Mapping[str, Sequence[Result]],
    path: Path,
    title: str,
    budget_ms: float | None = BUDGET_MS,
) -> Path:
    """PNG of p50/p90/p99/p99.9 versus offered rate, one colour per series, log latency axis,
    the budget as a dashed line and steps with errors circled in red."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    styles = {"p50": "-", "p90": "--", "p99": "-.", "p99.9": ":"}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (label, results) in enumerate(series.items()):
        ordered = sorted(results, key=lambda r: r.offered_rps)
        x = [r.offered_rps for r in ordered]
        colour = colours[index % len(colours)]
        for name, style in styles.items():
            y = [
                {"p50": r.p50_ms, "p90": r.p90_ms, "p99": r.p99_ms, "p99.9": r.p999_ms}[name]
                for r in ordered
            ]
            prefix = f"{label} " if len(series) > 1 else ""
            ax.plot(x, y, style, marker="o", ms=3, color=colour, label=f"{prefix}{name}")
        bad = [r for r in ordered if r.error_count]
        if bad:
            ax.scatter(
                [r.offered_rps for r in bad],
                [r.p99_ms for r in bad],
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
    ax.set_xlabel("offered rate (requests/s, open loop)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if len(series) > 1 else 1, loc="best", framealpha=0.85)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
