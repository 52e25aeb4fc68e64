"""How importing, feature computation, training and scoring grow with the history's size.

For each size the simulator writes a history as a CSV file (not timed), then the two user
commands run as child processes, exactly as a user runs them, on a fresh state folder:

    fraudmesh data import FILE --var-dir VAR          # read, check, features, publish,
                                                      # Feast apply, materialize (SQLite)
    fraudmesh train --var-dir VAR --scores-out S      # point-in-time join, model selection,
                                                      # test-period scoring and evaluation,
                                                      # ONNX export and parity, publish

Each command's wall time, CPU time and peak resident memory come from the kernel
(``wait4``); the steps inside come from the timings each command records (the dataset's
``dataset.json``, the model version's ``timings.json``). Results go to
``loadtest/results/scale.{json,md,png}``: a table and curves of time and peak memory
against rows. The machine's load average is recorded before and after each command: other
jobs on a shared machine slow a run down.

    python -m loadtest.scale                       # 100k, 500k and 2M rows
    python -m loadtest.scale --rows 100000         # one size
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest import provenance
from services.featurestore import layout
from services.models import repository
from services.pipelines import simulate

RESULTS = Path(__file__).with_name("results")
SIZES = (100_000, 500_000, 2_000_000)
# Rows per customer and day in the simulator's default world (about 200k rows for 4,000
# customers over 90 days); sizes grow customers and days together.
_ROWS_PER_CUSTOMER_DAY = 0.55
BUDGET_S = 300.0
"""Import + training at 2M rows must fit in this (the issue's target)."""
BUDGET_RSS_MB = 4096.0
"""…and in this much memory."""


@dataclass
class Command:
    """One child process's cost."""

    argv: list[str]
    """The command as a user types it (scratch paths shown as FILE, VAR, SCORES)."""
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    load_before: float
    load_after: float
    steps: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    """One size: the history and the two commands."""

    rows: int
    customers: int
    days: int
    file_mb: float
    simulate_s: float
    entities: dict[str, int] = field(default_factory=dict)
    """Distinct cards, merchants and terminals: the online store's rows."""
    dataset_mb: dict[str, float] = field(default_factory=dict)
    """Size of each Parquet file of the imported dataset (transactions, feature tables)."""
    data_import: Command | None = None
    train: Command | None = None
    test_rows: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    selection: list[dict[str, float]] = field(default_factory=list)
    """Each candidate: leaves, trees grown to early stopping, rows fitted on."""
    train_peaks_mb: dict[str, float] = field(default_factory=dict)
    """The training process's peak RSS when each of its steps ended (``memory.json``)."""

    @property
    def total_s(self) -> float:
        """Import plus training, wall time."""
        return sum(c.wall_s for c in (self.data_import, self.train) if c is not None)

    @property
    def peak_rss_mb(self) -> float:
        """The larger of the two commands' peaks (they run one after the other)."""
        return max((c.peak_rss_mb for c in (self.data_import, self.train) if c), default=0.0)


def _params(rows: int) -> simulate.SimulationParams:
    """A world of about ``rows`` transactions: customers and days grown together."""
    customer_days = rows / _ROWS_PER_CUSTOMER_DAY
    days = max(60, min(365, round(math.sqrt(customer_days / 40))))
    customers = max(500, round(customer_days / days))
    return simulate.SimulationParams(
        n_customers=customers, n_merchants=max(200, customers // 5), days=days
    )


def _fraudmesh() -> str:
    found = shutil.which("fraudmesh", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("fraudmesh is not installed next to this Python (make install)")
    return found


def _shown(argv: list[str], names: dict[Path, str]) -> list[str]:
    """``argv`` without this machine's paths: the program's name, placeholders for files."""
    shown = {str(path): name for path, name in names.items()}
    return [Path(argv[0]).name, *(shown.get(arg, arg) for arg in argv[1:])]


def _run(argv: list[str], log: Path, names: dict[Path, str]) -> Command:
    """Runs ``argv`` to completion; its wall and CPU time and peak RSS from wait4."""
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}); see {log}")
    return Command(
        argv=_shown(argv, names),
        wall_s=round(wall, 1),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
        peak_rss_mb=round(usage.ru_maxrss / 1024),
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )


def measure(rows: int, work: Path) -> Run:
    """Simulates about ``rows`` transactions, imports them and trains; returns the costs."""
    params = _params(rows)
    started = time.perf_counter()
    sim = simulate.simulate(params)
    source = work / f"history-{rows}.csv"
    sim.transactions.to_csv(source, index=False)
    run = Run(
        rows=len(sim.transactions),
        customers=params.n_customers,
        days=params.days,
        file_mb=round(source.stat().st_size / 2**20, 1),
        simulate_s=round(time.perf_counter() - started, 1),
        entities={
            name: int(sim.transactions[f"{name}_id"].nunique())
            for name in ("card", "merchant", "terminal")
        },
    )
    del sim
    var_dir = work / f"var-{rows}"
    fraudmesh = _fraudmesh()
    scores = work / f"scores-{rows}.parquet"
    names = {source: "FILE", var_dir: "VAR", scores: "SCORES"}
    print(f"{run.rows:,} rows ({run.customers:,} customers, {run.days} days): importing …")
    run.data_import = _run(
        [fraudmesh, "data", "import", str(source), "--var-dir", str(var_dir)],
        work / f"import-{rows}.log",
        names,
    )
    manifest = json.loads((var_dir / "data" / layout.MANIFEST_FILE).read_text())
    run.dataset_mb = {
        name: round((var_dir / "data" / name).stat().st_size / 2**20, 1)
        for name in layout.DATA_FILES
    }
    run.data_import.steps = dict(manifest["seconds"])
    inside = sum(run.data_import.steps.values())
    # Feast apply and materialize, plus interpreter start-up.
    run.data_import.steps["apply_materialize"] = round(run.data_import.wall_s - inside, 1)
    print(
        f"  import {run.data_import.wall_s:.0f} s, {run.data_import.peak_rss_mb:.0f} MB; training …"
    )
    run.train = _run(
        [fraudmesh, "train", "--var-dir", str(var_dir), "--scores-out", str(scores)],
        work / f"train-{rows}.log",
        names,
    )
    metadata, folder = repository.load(var_dir / "models")
    run.train.steps = json.loads((folder / "timings.json").read_text())
    memory = folder / "memory.json"
    run.train_peaks_mb = json.loads(memory.read_text()) if memory.is_file() else {}
    run.selection = json.loads((folder / "selection.json").read_text())
    run.test_rows = int(metadata.metrics.get("test_rows", 0))
    run.metrics = {
        k: round(v, 4)
        for k, v in metadata.metrics.items()
        if k in ("pr_auc", "roc_auc", "recall_at_1pct_fpr", "card_precision_at_100")
    }
    print(f"  train {run.train.wall_s:.0f} s, {run.train.peak_rss_mb:.0f} MB; {run.metrics}")
    shutil.rmtree(var_dir, ignore_errors=True)
    source.unlink()
    return run


def markdown(runs: Sequence[Run]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| rows | file | import (wall / CPU) | import peak RSS | train (wall / CPU) "
        "| train peak RSS | import + train | load avg (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        i, t = r.data_import, r.train
        assert i is not None and t is not None
        loads = f"{i.load_before:.1f}–{max(i.load_after, t.load_before, t.load_after):.1f}"
        lines.append(
            f"| {r.rows:,} | {r.file_mb:.0f} MB | {i.wall_s:.0f} s / {i.cpu_s:.0f} s "
            f"| {i.peak_rss_mb:,.0f} MB | {t.wall_s:.0f} s / {t.cpu_s:.0f} s "
            f"| {t.peak_rss_mb:,.0f} MB | **{r.total_s:.0f} s** | {loads} |"
        )
    lines += ["", "Steps (seconds):", ""]
    for r in runs:
        i, t = r.data_import, r.train
        assert i is not None and t is not None
        steps = ", ".join(f"{k} {v:.1f}" for k, v in i.steps.items())
        train_steps = ", ".join(f"{k} {v:.1f}" for k, v in t.steps.items())
        if r.train_peaks_mb:
            train_steps += "; training's peak RSS when each step ended (MB): " + ", ".join(
                f"{k} {v:,.0f}" for k, v in r.train_peaks_mb.items()
            )
        grown = ", ".join(
            f"{c['num_leaves']:.0f} leaves: {c['trees']:.0f} trees" for c in r.selection
        )
        fitted = r.selection[0]["fit_rows"] if r.selection else 0
        entities = ", ".join(f"{n:,} {name}s" for name, n in r.entities.items())
        lines.append(
            f"- {r.rows:,} rows ({entities}): import: {steps}; train: {train_steps} "
            f"(fitted on {fitted:,.0f} rows; {grown})"
        )
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Run], path: Path) -> None:
    """Time and peak memory against rows (log-log), with the budget lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r.rows for r in runs]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = {
        "import": [r.data_import.wall_s if r.data_import else 0 for r in runs],
        "train": [r.train.wall_s if r.train else 0 for r in runs],
        "import + train": [r.total_s for r in runs],
    }
    for label, values in series.items():
        ax_t.plot(rows, values, marker="o", label=label)
    ax_t.axhline(BUDGET_S, color="tab:red", linestyle="--", label="budget (5 min)")
    ax_t.set(xscale="log", yscale="log", xlabel="rows", ylabel="wall time (s)")
    ax_t.set_title("Time against rows")
    ax_t.legend(fontsize=8)
    memory = {
        "import": [r.data_import.peak_rss_mb if r.data_import else 0 for r in runs],
        "train": [r.train.peak_rss_mb if r.train else 0 for r in runs],
    }
    for label, values in memory.items():
        ax_m.plot(rows, values, marker="o", label=label)
    ax_m.axhline(BUDGET_RSS_MB, color="tab:red", linestyle="--", label="budget (4 GB)")
    ax_m.set(xscale="log", yscale="log", xlabel="rows", ylabel="peak RSS (MB)")
    ax_m.set_title("Peak memory against rows")
    ax_m.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the sizes in order and writes the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fraudmesh-scale-", dir=args.work) as tmp:
        runs = [measure(rows, Path(tmp)) for rows in args.rows]
    report = {
        "cpus": os.cpu_count(),
        "runs": [asdict(r) | {"total_s": r.total_s, "peak_rss_mb": r.peak_rss_mb} for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = markdown(runs)
    provenance.write(args.out, report, table, provenance.record())
    plot(runs, args.out.with_suffix(".png"))
    print(table)
    largest = max(runs, key=lambda r: r.rows)
    within = largest.total_s <= BUDGET_S and largest.peak_rss_mb <= BUDGET_RSS_MB
    print(
        f"{largest.rows:,} rows: {largest.total_s:.0f} s (budget {BUDGET_S:.0f} s), "
        f"{largest.peak_rss_mb:,.0f} MB (budget {BUDGET_RSS_MB:,.0f} MB): "
        + ("within budget" if within else "OVER BUDGET")
    )
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
