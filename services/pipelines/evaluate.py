"""Evaluation on a test period with the field's metrics, for any scorer (a model, the rules).

``evaluate`` judges one set of scores on the test rows: ROC-AUC, average precision (PR-AUC),
recall at 1% false-positive rate (the threshold that flags 1% of the test's genuine
payments), precision, recall and false-positive rate at given review and decline thresholds
(chosen beforehand, on validation data), and card precision at k: for each test day, the k
cards with the highest score (a card's score that day is the highest of its payments), the
share of them with a fraud that day; the mean over the days. ``Report`` puts a model's,
its cascade's and small model's (when it has one) and the rules' figures side by side and
writes them as JSON, a Markdown summary and a PNG (precision-recall curves, score
distributions by label, card precision at k per day).

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
    cascade: Evaluation | None = None
    """The cascade (the small model's clear approvals, the model for the rest) at the model's
    thresholds; None without a small model."""
    small_model: Evaluation | None = None
    """The small model alone at its own thresholds (the first fallback)."""
    cascade_summary: dict[str, float] = field(default_factory=dict)
    """The clear-approve threshold, the first stage's share of validation and test payments,
    and the model's review frauds the cascade lost on the test period."""

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
        others: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, Path]:
        """Writes ``<name>.json``, ``<name>.md`` and ``<name>.png`` into ``folder``; ``others``
        are more scorers' test scores by name, for the precision-recall plot."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = {ext: folder / f"{name}.{ext}" for ext in ("json", "md", "png")}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))
        paths["md"].write_text(self.markdown())
        plot(self, y, model_scores, rules_scores, paths["png"], others)
        return paths

    def _scorers(self) -> list[tuple[str, Evaluation]]:
        """Every judged scorer, by its column name: model, cascade, small model, rules."""
        named = [("model", self.model), ("cascade", self.cascade)]
        named += [("small model alone", self.small_model), ("rules fallback", self.rules)]
        return [(label, e) for label, e in named if e is not None]

    def markdown(self) -> str:
        """A short Markdown summary: periods, then each scorer's figures side by side (the
        model, the cascade and the small model alone when there is one, the rules)."""
        scorers = self._scorers()
        k = self.model.card_precision_k
        lines = ["# Evaluation on the test period", ""]
        for period, (start, end) in self.periods.items():
            count = self.rows.get(f"{period}_rows", 0)
            frauds = self.rows.get(f"{period}_frauds", 0)
            lines.append(f"- {period}: {start} → {end} ({count:,} payments, {frauds:,} frauds)")
        lines += ["", "| metric | " + " | ".join(label for label, _ in scorers) + " |"]
        lines.append("|---|" + "---:|" * len(scorers))

        def row(label: str, values: list[str]) -> None:
            lines.append(f"| {label} | " + " | ".join(values) + " |")

        for label, get in (
            ("ROC-AUC", lambda e: e.roc_auc),
            ("average precision (PR-AUC)", lambda e: e.average_precision),
            ("recall at 1% FPR", lambda e: e.recall_at_1pct_fpr),
            (f"card precision at {k} (mean per day)", lambda e: e.card_precision_at_k),
            (f"… its ceiling (fraudulent cards per day, at most {k})",
             lambda e: e.card_precision_ceiling),
        ):  # fmt: skip
            row(label, [f"{get(e):.4f}" for _, e in scorers])
        for point in ("review", "decline"):
            points: list[OperatingPoint] = [getattr(e, point) for _, e in scorers]
            row(f"{point} threshold", [f"{p.threshold:.4f}" for p in points])
            row(f"precision at {point}", [f"{p.precision:.4f}" for p in points])
            row(f"recall at {point}", [f"{p.recall:.4f}" for p in points])
            row(f"false-positive rate at {point}", [f"{p.fpr:.4%}" for p in points])
        if self.model.recall_at_review_by_scenario:
            head = " | ".join(f"{label} recall at review" for label, _ in scorers)
            lines += ["", f"| fraud scenario | {head} |", "|---|" + "---:|" * len(scorers)]
            for scenario in self.model.recall_at_review_by_scenario:
                values = [
                    e.recall_at_review_by_scenario.get(scenario, math.nan) for _, e in scorers
                ]
                row(scenario, [f"{v:.4f}" for v in values])
        lines += self._cascade_lines()
        if self.source:
            lines += ["", "| training data | rows |", "|---|---:|"]
            lines += [f"| {name} | {count:,} |" for name, count in self.source.items()]
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join(lines) + "\n"

    def _cascade_lines(self) -> list[str]:
        """What the cascade's first stage did, in words; nothing without a small model."""
        c = self.cascade_summary
        if self.cascade is None or not c:
            return []
        return [
            "",
            f"The cascade's first stage (the small model below its clear-approve threshold "
            f"{c['cascade_clear_approve']:.4g}) answers {c['cascade_first_stage_share']:.1%} of "
            f"the test payments ({c['cascade_validation_first_stage_share']:.1%} of validation) "
            f"without the model; it approves {c['cascade_review_frauds_lost']:.0f} of the "
            f"{c['cascade_review_frauds']:.0f} frauds the model flags at review. The cascade "
            "column is judged at the model's thresholds, the small model alone at its own.",
        ]


def plot(
    report: Report,
    y: np.ndarray,
    model_scores: np.ndarray,
    rules_scores: np.ndarray,
    path: Path,
    others: Mapping[str, np.ndarray] | None = None,
) -> None:
    """PR curves (model, ``others`` by name, rules), score distributions by label, card
    precision per day."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fraud = np.asarray(y).astype(bool)
    fig, (ax_pr, ax_hist, ax_cp) = plt.subplots(1, 3, figsize=(16, 4.6))
    curves = [("model", model_scores, "tab:blue"), ("rules", rules_scores, "tab:gray")]
    colors = iter(("tab:purple", "tab:cyan", "tab:olive", "tab:brown"))
    curves[1:1] = [(name, scores, next(colors)) for name, scores in (others or {}).items()]
    for label, scores, color in curves:
        precision, recall, _ = metrics.precision_recall_curve(fraud, scores)
        ap = metrics.average_precision(fraud, scores)
        ax_pr.plot(recall, precision, color=color, label=f"{label} (AP {ap:.3f})")
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
    """The model's figures, the rules' beside them (``rules_`` prefix), the cascade's and the
    small model's when judged (``cascade_``, ``small_``) and ``extra``, flat."""
    metrics = report.model.flat() | report.rules.flat("rules_")
    if report.cascade is not None:
        metrics |= report.cascade.flat("cascade_") | dict(report.cascade_summary)
    if report.small_model is not None:
        metrics |= report.small_model.flat("small_")
    metrics |= {name: float(value) for name, value in report.rows.items()}
    return metrics | dict(extra or {})
