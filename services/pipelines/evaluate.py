"""Evaluation on a test period with the field's metrics, for any scorer (a model, the rules).

``evaluate`` judges one set of scores on the test rows: ROC-AUC, average precision (PR-AUC),
recall at 1% false-positive rate (the threshold that flags 1% of the test's genuine
payments), precision, recall and false-positive rate at given review and decline thresholds
(chosen beforehand, on validation data), and card precision at k: for each test day, the k
cards with the highest score (a card's score that day is the highest of its payments), the
share of them with a fraud that day; the mean over the days. ``Report`` puts a model's and
the rules' figures side by side and writes them as JSON, a Markdown summary and a PNG
(precision-recall curves, score distributions by label, card precision at k per day).

The functions take plain arrays, so the same holdout can judge several model versions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from services.domain import metrics
from services.domain.metrics import OperatingPoint, operating_point, threshold_at_fpr

CARD_PRECISION_K = 100
"""Default k of card precision at k (cards a fraud team can review in a day)."""
RECALL_AT_FPR = 0.01
"""The false-positive rate of the "recall at FPR" metric."""

__all__ = [
    "CARD_PRECISION_K",
    "RECALL_AT_FPR",
    "Evaluation",
    "OperatingPoint",
    "Report",
    "evaluate",
    "flat_metrics",
    "operating_point",
    "plot",
    "threshold_at_fpr",
]


@dataclass(frozen=True)
class Evaluation:
    """One scorer's figures on the test rows."""

    roc_auc: float
    average_precision: float
    recall_at_1pct_fpr: float
    review: OperatingPoint
    decline: OperatingPoint
    card_precision_k: int
    card_precision_at_k: float
    card_precision_per_day: dict[str, float]
    card_precision_ceiling: float
    """The best card precision at k possible: days with fewer than k fraudulent cards cap it."""
    recall_at_review_by_scenario: dict[str, float] = field(default_factory=dict)

    def flat(self, prefix: str = "") -> dict[str, float]:
        """The figures as one flat ``name → number`` mapping (model metadata's form)."""
        k = self.card_precision_k
        out = {
            "roc_auc": self.roc_auc,
            "pr_auc": self.average_precision,
            "recall_at_1pct_fpr": self.recall_at_1pct_fpr,
            f"card_precision_at_{k}": self.card_precision_at_k,
            f"card_precision_at_{k}_ceiling": self.card_precision_ceiling,
        }
        for name, point in (("review", self.review), ("decline", self.decline)):
            out[f"precision_at_{name}"] = point.precision
            out[f"recall_at_{name}"] = point.recall
            out[f"fpr_at_{name}"] = point.fpr
        for scenario, recall in self.recall_at_review_by_scenario.items():
            out[f"recall_at_review/{scenario}"] = recall
        return {f"{prefix}{name}": float(value) for name, value in out.items()}


def evaluate(
    y: np.ndarray,
    scores: np.ndarray,
    *,
    review: float,
    decline: float,
    days: np.ndarray,
    cards: np.ndarray,
    k: int = CARD_PRECISION_K,
    scenarios: np.ndarray | None = None,
) -> Evaluation:
    """Judges ``scores`` against labels ``y`` (both classes must occur) on the test rows.

    ``days`` (the UTC day of each row) and ``cards`` feed card precision at ``k``;
    ``scenarios`` (what produced each fraud, where the data says) adds recall per scenario.
    """
    y = np.asarray(y).astype(np.int8)
    scores = np.asarray(scores, dtype=np.float64)
    if y.min() == y.max():
        raise ValueError("the test rows need both fraud and genuine payments")
    judged_days, per_day = metrics.card_precision_per_day(days, cards, y, scores, k)
    # A perfect scorer ranks every fraudulent card of the day first.
    _, ceiling = metrics.card_precision_per_day(days, cards, y, y.astype(np.float64), k)
    review_point = operating_point(y, scores, review)
    by_scenario: dict[str, float] = {}
    if scenarios is not None:
        fraud_scenarios = np.asarray(scenarios, dtype=object)
        for scenario in sorted({str(s) for s in fraud_scenarios[y == 1]}):
            cases = (fraud_scenarios == scenario) & (y == 1)
            by_scenario[scenario] = float((scores[cases] >= review).mean())
    return Evaluation(
        roc_auc=metrics.roc_auc(y, scores),
        average_precision=metrics.average_precision(y, scores),
        recall_at_1pct_fpr=metrics.recall_at_fpr(y, scores, RECALL_AT_FPR),
        review=review_point,
        decline=operating_point(y, scores, decline),
        card_precision_k=k,
        card_precision_at_k=float(per_day.mean()),
        card_precision_per_day={
            str(day)[:10]: float(v) for day, v in zip(judged_days, per_day, strict=True)
        },
        card_precision_ceiling=float(ceiling.mean()),
        recall_at_review_by_scenario=by_scenario,
    )


@dataclass(frozen=True)
class Report:
    """A model's and the rules fallback's figures on one test period, and its context."""

    model: Evaluation
    rules: Evaluation
    periods: dict[str, list[str]]
    """``train``, ``validation``, ``test``: [from, until) as ISO timestamps (UTC)."""
    rows: dict[str, int]
    """Rows and frauds per period."""
    notes: list[str] = field(default_factory=list)
    """Caveats worth reading next to the figures (e.g. a training window too close to the test)."""
    source: dict[str, int] = field(default_factory=dict)
    """Where the data came from, by origin and label, when it was built from more than one
    (retraining from the decision log); empty for a single dataset."""

    def to_dict(self) -> dict[str, object]:
        """The report as plain JSON-ready values."""
        return asdict(self)

    def write(
        self,
        folder: Path,
        y: np.ndarray,
        model_scores: np.ndarray,
        rules_scores: np.ndarray,
        name: str = "evaluation",
    ) -> dict[str, Path]:
        """Writes ``<name>.json``, ``<name>.md`` and ``<name>.png`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = {ext: folder / f"{name}.{ext}" for ext in ("json", "md", "png")}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        paths["md"].write_text(self.markdown())
        plot(self, y, model_scores, rules_scores, paths["png"])
        return paths

    def markdown(self) -> str:
        """A short Markdown summary: periods, then the model's and the rules' figures."""
        m, r = self.model, self.rules
        k = m.card_precision_k
        lines = ["# Evaluation on the test period", ""]
        for period, (start, end) in self.periods.items():
            count = self.rows.get(f"{period}_rows", 0)
            frauds = self.rows.get(f"{period}_frauds", 0)
            lines.append(f"- {period}: {start} → {end} ({count:,} payments, {frauds:,} frauds)")
        lines += ["", "| metric | model | rules fallback |", "|---|---:|---:|"]
        rows: list[tuple[str, float, float, str]] = [
            ("ROC-AUC", m.roc_auc, r.roc_auc, ".4f"),
            ("average precision (PR-AUC)", m.average_precision, r.average_precision, ".4f"),
            ("recall at 1% FPR", m.recall_at_1pct_fpr, r.recall_at_1pct_fpr, ".4f"),
            (f"card precision at {k} (mean per day)", m.card_precision_at_k, r.card_precision_at_k, ".4f"),
            (f"… its ceiling (fraudulent cards per day, at most {k})", m.card_precision_ceiling, r.card_precision_ceiling, ".4f"),
        ]  # fmt: skip
        for label, a, b, fmt in rows:
            lines.append(f"| {label} | {a:{fmt}} | {b:{fmt}} |")
        for point in ("review", "decline"):
            mp: OperatingPoint = getattr(m, point)
            rp: OperatingPoint = getattr(r, point)
            lines.append(f"| {point} threshold | {mp.threshold:.4f} | {rp.threshold:.4f} |")
            lines.append(f"| precision at {point} | {mp.precision:.4f} | {rp.precision:.4f} |")
            lines.append(f"| recall at {point} | {mp.recall:.4f} | {rp.recall:.4f} |")
            lines.append(f"| false-positive rate at {point} | {mp.fpr:.4%} | {rp.fpr:.4%} |")
        if m.recall_at_review_by_scenario:
            lines += ["", "| fraud scenario | model recall at review | rules recall at review |"]
            lines.append("|---|---:|---:|")
            for scenario, recall in m.recall_at_review_by_scenario.items():
                rules_recall = r.recall_at_review_by_scenario.get(scenario, math.nan)
                lines.append(f"| {scenario} | {recall:.4f} | {rules_recall:.4f} |")
        if self.source:
            lines += ["", "| training data | rows |", "|---|---:|"]
            lines += [f"| {name} | {count:,} |" for name, count in self.source.items()]
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines) + "\n"


def plot(
    report: Report, y: np.ndarray, model_scores: np.ndarray, rules_scores: np.ndarray, path: Path
) -> None:
    """PR curves (model and rules), score distributions by label, card precision per day."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fraud = np.asarray(y).astype(bool)
    fig, (ax_pr, ax_hist, ax_cp) = plt.subplots(1, 3, figsize=(16, 4.6))
    for label, scores, evaluation, color in (
        ("model", model_scores, report.model, "tab:blue"),
        ("rules", rules_scores, report.rules, "tab:gray"),
    ):
        precision, recall, _ = metrics.precision_recall_curve(fraud, scores)
        ax_pr.plot(
            recall, precision, color=color, label=f"{label} (AP {evaluation.average_precision:.3f})"
        )
    for name, point, color in (
        ("review", report.model.review, "tab:orange"),
        ("decline", report.model.decline, "tab:red"),
    ):
        ax_pr.scatter(point.recall, point.precision, color=color, zorder=3, label=f"model {name}")
    ax_pr.set(xlabel="recall", ylabel="precision", title="Precision-recall (test period)")
    ax_pr.set_xlim(0, 1)
    ax_pr.set_ylim(0, 1.02)
    ax_pr.legend(loc="lower left", fontsize=8)

    bins = np.linspace(0.0, 1.0, 51)
    ax_hist.hist(model_scores[~fraud], bins=bins, alpha=0.6, label="genuine", color="tab:green")
    ax_hist.hist(model_scores[fraud], bins=bins, alpha=0.6, label="fraud", color="tab:red")
    ax_hist.set_yscale("log")
    for point, style in ((report.model.review, "--"), (report.model.decline, ":")):
        ax_hist.axvline(point.threshold, color="black", linestyle=style, linewidth=1)
    ax_hist.set(xlabel="model score", ylabel="payments (log)", title="Scores by label")
    ax_hist.legend(fontsize=8)

    k = report.model.card_precision_k
    for label, evaluation, color in (
        ("model", report.model, "tab:blue"),
        ("rules", report.rules, "tab:gray"),
    ):
        per_day = pd.Series(evaluation.card_precision_per_day)
        ax_cp.plot(pd.to_datetime(per_day.index), per_day.to_numpy(), marker="o", color=color,
                   label=f"{label} (mean {evaluation.card_precision_at_k:.3f})")  # fmt: skip
    ax_cp.set(ylabel=f"card precision at {k}", title=f"Card precision at {k} per day")
    ax_cp.set_ylim(0, 1.02)
    ax_cp.tick_params(axis="x", labelrotation=45)
    ax_cp.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def flat_metrics(report: Report, extra: Mapping[str, float] | None = None) -> dict[str, float]:
    """The model's figures, the rules' beside them (``rules_`` prefix) and ``extra``, flat."""
    metrics = report.model.flat() | report.rules.flat("rules_")
    metrics |= {name: float(value) for name, value in report.rows.items()}
    return metrics | dict(extra or {})
