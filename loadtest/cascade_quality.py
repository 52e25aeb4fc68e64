"""The cascade's quality targets, judged on training reports, and a run over several seeds of
the simulated data.

Targets (on the test period, every labelled payment): the cascade's recall at the model's
review and decline thresholds within 0.5 % of the model's own (it may lose at most that share
of the model's frauds), its precision at decline not lower than the model's, and the small
model alone keeping at least 85 % of the model's recall at review. ``judge`` reads them off an
``evaluation.json``; ``loadtest/external.py`` applies them to the handbook-style data.

    python -m loadtest.cascade_quality --seeds 7,8,9   # writes loadtest/results/cascade-quality.*

Each seed simulates the default preset, registers it with Feast and trains, as a user would
(``fraudmesh features simulate``, ``features apply``, ``train``), in a scratch folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtest import provenance

RESULTS = Path(__file__).with_name("results")
MAX_RECALL_LOSS = 0.005
"""The cascade's recall at review and decline may be this share below the model's."""
MIN_SMALL_RECALL_SHARE = 0.85
"""The small model alone keeps at least this share of the model's recall at review."""
SCORERS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("cascade", "cascade"),
    ("small model", "small_model"),
    ("rules", "rules"),
)
"""Column name and ``evaluation.json`` key of each scorer the report compares."""


@dataclass(frozen=True)
class Target:
    """One quality target: what it compares, the figure, the limit, and whether it is met."""

    name: str
    value: float
    limit: float
    met: bool


def judge(evaluation: Mapping[str, Any]) -> list[Target]:
    """The cascade's and the small model's targets on one training report (evaluation.json)."""
    model, cascade, small = evaluation["model"], evaluation["cascade"], evaluation["small_model"]

    def at_least(name: str, value: float, limit: float) -> Target:
        return Target(name, value, limit, value >= limit - 1e-12)

    return [
        at_least(
            "cascade recall at review",
            cascade["review"]["recall"],
            model["review"]["recall"] * (1 - MAX_RECALL_LOSS),
        ),
        at_least(
            "cascade recall at decline",
            cascade["decline"]["recall"],
            model["decline"]["recall"] * (1 - MAX_RECALL_LOSS),
        ),
        at_least(
            "cascade precision at decline",
            cascade["decline"]["precision"],
            model["decline"]["precision"],
        ),
        at_least(
            "small model recall at review",
            small["review"]["recall"],
            model["review"]["recall"] * MIN_SMALL_RECALL_SHARE,
        ),
    ]


def figures(evaluation: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each scorer's headline figures: ROC-AUC, AP, precision and recall at review and
    decline, card precision at k."""
    out: dict[str, dict[str, float]] = {}
    for label, key in SCORERS:
        e = evaluation.get(key)
        if not e:
            continue
        out[label] = {
            "roc_auc": e["roc_auc"],
            "average_precision": e["average_precision"],
            "precision_at_review": e["review"]["precision"],
            "recall_at_review": e["review"]["recall"],
            "precision_at_decline": e["decline"]["precision"],
            "recall_at_decline": e["decline"]["recall"],
            "card_precision_at_k": e["card_precision_at_k"],
        }
    return out


def table(rows: Mapping[str, Mapping[str, dict[str, float]]]) -> str:
    """Markdown: one line per run and scorer with the headline figures."""
    lines = [
        "| run | scorer | ROC-AUC | AP | precision at review | recall at review "
        "| precision at decline | recall at decline | card precision at 100 |",
        "|---|---|" + "---:|" * 7,
    ]
    for run, scorers in rows.items():
        for label, f in scorers.items():
            lines.append(
                f"| {run} | {label} | {f['roc_auc']:.4f} | {f['average_precision']:.4f} "
                f"| {f['precision_at_review']:.4f} | {f['recall_at_review']:.4f} "
                f"| {f['precision_at_decline']:.4f} | {f['recall_at_decline']:.4f} "
                f"| {f['card_precision_at_k']:.4f} |"
            )
    return "\n".join(lines)


def targets_table(rows: Mapping[str, Sequence[Target]]) -> str:
    """Markdown: each run's targets, figure against limit."""
    lines = ["| run | target | figure | limit | met |", "|---|---|---:|---:|---|"]
    for run, targets in rows.items():
        for t in targets:
            lines.append(
                f"| {run} | {t.name} | {t.value:.4f} | {t.limit:.4f} | {'yes' if t.met else 'NO'} |"
            )
    return "\n".join(lines)


def cascade_line(run: str, evaluation: Mapping[str, Any]) -> str:
    """The first stage's share and the review frauds it approved, in words."""
    c = evaluation.get("cascade_summary") or {}
    if not c:
        return f"- {run}: no small model"
    return (
        f"- {run}: clear-approve below {c['cascade_clear_approve']:.4g}; first stage "
        f"{c['cascade_first_stage_share']:.1%} of the test payments "
        f"({c['cascade_validation_first_stage_share']:.1%} of validation); "
        f"{c['cascade_review_frauds_lost']:.0f} of the model's {c['cascade_review_frauds']:.0f} "
        "review frauds approved by it"
    )


def _fraudmesh() -> str:
    found = shutil.which("fraudmesh", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("fraudmesh is not installed next to this Python (make install)")
    return found


def _run(argv: list[str], log: Path) -> float:
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}); see {log}")
    return round(time.perf_counter() - started, 1)


def run_seed(work: Path, seed: int) -> dict[str, Any]:
    """Simulates the default preset with ``seed``, trains, returns the training report."""
    fraudmesh = _fraudmesh()
    var_dir = work / f"seed-{seed}"
    report_dir = var_dir / "report"
    seconds = {
        "simulate": _run(
            [fraudmesh, "features", "simulate", "--var-dir", str(var_dir), "--seed", str(seed)],
            work / f"simulate-{seed}.log",
        ),
        "apply": _run(
            [fraudmesh, "features", "apply", "--var-dir", str(var_dir)], work / f"apply-{seed}.log"
        ),
        "train": _run(
            [fraudmesh, "train", "--var-dir", str(var_dir), "--report-dir", str(report_dir)],
            work / f"train-{seed}.log",
        ),
    }
    evaluation = json.loads((report_dir / "evaluation.json").read_text())
    return {"seed": seed, "seconds": seconds, "evaluation": evaluation}


def markdown(runs: Sequence[Mapping[str, Any]]) -> str:
    """The side-by-side figures, the targets and the first stage of every seed."""
    named = {f"seed {r['seed']}": r["evaluation"] for r in runs}
    return "\n".join(
        [
            "# The cascade's quality on the simulated data (default preset)",
            "",
            "Test period of each seed's training report (every labelled payment). The cascade "
            "and the rules are judged at their thresholds (the cascade at the model's), the "
            "small model alone at its own.",
            "",
            table({run: figures(e) for run, e in named.items()}),
            "",
            targets_table({run: judge(e) for run, e in named.items()}),
            "",
            *[cascade_line(run, e) for run, e in named.items()],
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Trains on each seed's simulated data and writes the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="7,8,9", help="simulator seeds, comma-separated")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS / "cascade-quality")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma-separated list of integers")
    runs = []
    with tempfile.TemporaryDirectory(prefix="fraudmesh-cascade-", dir=args.work) as tmp:
        for seed in seeds:
            runs.append(run_seed(Path(tmp), seed))
            print(cascade_line(f"seed {seed}", runs[-1]["evaluation"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = [
        {
            "seed": r["seed"],
            "seconds": r["seconds"],
            "figures": figures(r["evaluation"]),
            "targets": [asdict(t) for t in judge(r["evaluation"])],
            "cascade": r["evaluation"].get("cascade_summary", {}),
        }
        for r in runs
    ]
    text = markdown(runs)
    provenance.write(args.out, summary, text, provenance.record())
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
