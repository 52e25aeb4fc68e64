"""``fraudmesh monitor report``: the monitor's figures computed from the decision log.

For each model version that answered in the window: its decisions, drift against its
reference (PSI of the score and of every feature, each feature's missing share), decision
rates (over the window and per hour or day), and live quality from the reported outcomes:

- at the top level, every decision labelled by retraining's rule (``retraining.labellings``:
  FRAUD → fraud, LEGITIMATE → genuine, DISPUTED → unlabelled, none → genuine once older than
  the label delay), the figures ``fraudmesh decisions export`` gives;
- split as the monitor's gauges are, into ``matured`` and ``immature`` cohorts (by decision
  hour, ``services.monitor.evaluation``), never mixed;
- per decision day, with Wilson intervals.

A version that only shadowed gets its shadow scores' PSI and its agreement with the answers.
The retraining advice the monitor recorded in the window closes the report. Output: JSON of
the shape ``{"versions": {"<v>": {"decisions": n, "labelled": n, "precision_at_review": x,
…, "psi": {"score": x, …}}}, "advice": [...]}``, or Markdown with a PNG per version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from services.domain import aggregation, metrics
from services.models import reference as references
from services.models import repository
from services.monitor import advice as monitor_advice
from services.monitor import evaluation
from services.monitor.engine import MonitorPolicy
from services.monitor.rulewatch import RuleWatch, rules_fired
from services.pipelines import decisions
from services.pipelines.retraining import Labelling, labellings

_US = 1_000_000
_COLUMNS = (
    "transaction_id",
    "model_version",
    "decision",
    "score",
    "decided_at",
    "transaction_at",
    "outcome",
    "features",
    "feature_schema",
    "missing_features",
    "shadow_score",
    "shadow_model_version",
    "scored_by",
    "reasons",
    "shadow_rules",
)
_DECISIONS = ("approve", "review", "decline")
_FLAGGED = {"review": ("review", "decline"), "decline": ("decline",)}


@dataclass(frozen=True)
class ReportParams:
    """What the report covers and how it labels."""

    since: datetime | None = None
    until: datetime | None = None
    now: datetime | None = None
    """The moment labels are judged at (default: now)."""
    label_delay: timedelta = aggregation.LABEL_DELAY
    min_decisions: int = MonitorPolicy().min_decisions
    """Fewest decisions for a PSI (the monitor's rule), else null."""


@dataclass
class Report:
    """The report's figures (``to_json`` is the JSON form)."""

    generated_at: datetime
    params: ReportParams
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    advice: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    """The fraud team's rules, live and in shadow: fires, fire ratio, labelled frauds and
    good payments, precision (``rule_figures``)."""
    hourly: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Decision counts per period and decision, per version (the PNG's last panel)."""
    score_bins: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per version: reference and live proportions in the score's reference bins."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (NaN as null)."""
        return _clean(
            {
                "generated_at": self.generated_at.isoformat(),
                "window": {
                    "since": _iso(self.params.since),
                    "until": _iso(self.params.until),
                    "label_delay_days": self.params.label_delay / timedelta(days=1),
                },
                "versions": self.versions,
                "advice": self.advice,
                "rules": self.rules,
            }
        )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return _clean(float(value))
    return value


def build(
    log_root: Path,
    model_root: Path,
    model_name: str = repository.DEFAULT_MODEL_NAME,
    params: ReportParams | None = None,
    advice_file: Path | None = None,
) -> Report:
    """The report of the decision log at ``log_root`` against the versions in ``model_root``."""
    p = params or ReportParams()
    now = p.now or datetime.now(UTC)
    report = Report(now, p)
    table, _ = decisions.joined(log_root, p.since, p.until)
    frame = _frame(table)
    orders = decisions.feature_orders(table)
    shadow_versions = set(frame["shadow_model_version"].dropna()) - {""}
    for version in sorted(set(frame["model_version"]) | shadow_versions):
        rows = frame[frame["model_version"] == version]
        known = _known(model_root, model_name, version)
        if len(rows):
            report.versions[version] = _version(report, version, rows, known, orders, now, p)
        shadowed = frame[frame["shadow_model_version"] == version]
        if len(shadowed) and known is not None:
            entry = report.versions.setdefault(version, {"decisions": 0})
            entry["shadow"] = _shadow(shadowed, known, p)
    report.rules = rule_figures(frame)
    if advice_file is not None:
        report.advice = [
            entry
            for entry in monitor_advice.read(advice_file)
            if _within(float(entry.get("at_s", 0.0)), p)
        ]
    return report


def rule_figures(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each rule's figures over the decisions of ``frame``, counted as the monitor counts
    them (``services.monitor.rulewatch``)."""
    watch = RuleWatch()
    if "shadow_rules" not in frame.columns or "reasons" not in frame.columns:
        return []
    for row in frame[
        ["scored_by", "model_version", "reasons", "decision", "shadow_rules", "outcome"]
    ].itertuples(index=False):
        rules = rules_fired(
            row.scored_by == "rules",
            str(row.model_version or ""),
            list(row.reasons if row.reasons is not None else ()),
            str(row.decision or ""),
            list(row.shadow_rules if row.shadow_rules is not None else ()),
        )
        watch.decided(0, rules)
        if isinstance(row.outcome, str):
            watch.labelled(0, rules, row.outcome)
    return [asdict(view) for view in watch.views(0, 0)]


def _within(at_s: float, p: ReportParams) -> bool:
    if p.since is not None and at_s < p.since.timestamp():
        return False
    return not (p.until is not None and at_s >= p.until.timestamp())


def _frame(table: pa.Table) -> pd.DataFrame:
    present = [c for c in _COLUMNS if c in table.column_names]
    frame = table.select(present).to_pandas()
    for column in _COLUMNS:
        if column not in frame:
            frame[column] = None
    at = frame["transaction_at"].where(frame["transaction_at"].notna(), frame["decided_at"])
    frame["at"] = at
    decided = frame["decided_at"].where(frame["decided_at"].notna(), at)
    frame["decided_us"] = decided.astype("datetime64[us, UTC]").astype("int64")
    frame["outcome"] = frame["outcome"].astype(object).where(frame["outcome"].notna(), None)
    return frame


@dataclass(frozen=True)
class _Known:
    metadata: repository.ModelMetadata
    reference: references.ModelReference | None


def _known(model_root: Path, name: str, version: str) -> _Known | None:
    if repository.version_problem(version) is not None:
        return None  # the rules fallback's ``rules-…``: no folder to read
    try:
        metadata, folder = repository.load(model_root, name, version)
    except repository.ModelNotFoundError:
        return None
    return _Known(metadata, references.load(folder))


def _figures(
    decided: np.ndarray, fraud: np.ndarray, labelled: np.ndarray, scores: np.ndarray
) -> dict[str, Any]:
    """Precision and recall at both thresholds (the decisions answered) with Wilson
    intervals, and average precision, over the labelled rows."""
    frauds = int((fraud & labelled).sum())
    out: dict[str, Any] = {"labelled": int(labelled.sum()), "frauds": frauds}
    intervals: dict[str, Any] = {}
    for name, flagged_as in _FLAGGED.items():
        flagged = np.isin(decided, flagged_as) & labelled
        caught = int((flagged & fraud).sum())
        precision = metrics.wilson_interval(caught, int(flagged.sum()))
        recall = metrics.wilson_interval(caught, frauds)
        out[f"precision_at_{name}"] = precision.estimate
        out[f"recall_at_{name}"] = recall.estimate
        intervals[f"precision_at_{name}"] = [precision.low, precision.high]
        intervals[f"recall_at_{name}"] = [recall.low, recall.high]
    ap = math.nan
    if labelled.any():
        ap = metrics.average_precision(fraud[labelled], scores[labelled])
    out["average_precision"] = ap
    out["intervals"] = intervals
    return out


def _version(
    report: Report,
    version: str,
    rows: pd.DataFrame,
    known: _Known | None,
    orders: Mapping[str, tuple[str, ...]],
    now: datetime,
    p: ReportParams,
) -> dict[str, Any]:
    scores = rows["score"].to_numpy(dtype=np.float64)
    decided = rows["decision"].to_numpy(dtype=object)
    outcome = rows["outcome"].to_numpy(dtype=object)
    label = labellings(outcome, rows["at"], now, p.label_delay)
    fraud = label == Labelling.FRAUD.value
    labelled = np.isin(
        label,
        [Labelling.FRAUD.value, Labelling.LEGITIMATE.value, Labelling.PRESUMED_GENUINE.value],
    )
    entry: dict[str, Any] = {"decisions": len(rows)}
    entry.update(_figures(decided, fraud, labelled, scores))
    entry["decision_rates"] = {d: float(np.mean(decided == d)) for d in _DECISIONS}
    # The monitor's split: cohorts by decision hour, matured once all of it is past the delay.
    now_us = int(now.timestamp() * _US)
    delay_us = int(p.label_delay / timedelta(microseconds=1))
    hours = rows["decided_us"].to_numpy() // evaluation.HOUR_US
    is_matured = np.asarray([evaluation.matured(int(h), now_us, delay_us) for h in hours], bool)
    out_fraud = outcome == "fraud"
    known_outcome = pd.notna(outcome)
    disputed = known_outcome & (outcome != "fraud") & (outcome != "legitimate")
    for name, mask, labelled_here in (
        ("matured", is_matured, is_matured & ~disputed),
        ("immature", ~is_matured, ~is_matured & known_outcome & ~disputed),
    ):
        part = _figures(decided[mask], out_fraud[mask], labelled_here[mask], scores[mask])
        part["decisions"] = int(mask.sum())
        entry[name] = part
    entry["cohorts"] = _cohorts(rows, decided, fraud, labelled, scores, now, p)
    entry["psi"], entry["missing_ratio"] = {}, {}
    if known is not None and known.reference is not None:
        ref = known.reference
        # The monitor's rule (services/monitor/tally.py): the full model's and the first
        # stage's answers only, against the cascade's distribution when any came through it.
        engine = rows["scored_by"].fillna("model").to_numpy(dtype=object)
        own = scores[(engine == "model") | (engine == "first_stage")]
        cascade = bool((engine == "first_stage").any()) and ref.answered is not None
        against = ref.score_reference(cascade)
        entry["score_against"] = "cascade" if cascade else "model"
        entry["psi"]["score"] = against.psi(own) if len(own) >= p.min_decisions else math.nan
        report.score_bins[version] = (
            np.asarray(against.proportions),
            against.counts(own) / max(len(own), 1),
        )
        matrix = _feature_matrix(rows, orders, tuple(ref.features))
        for j, name in enumerate(ref.features):
            column = matrix[:, j]
            distribution = ref.features[name]
            values: Sequence[Any] | np.ndarray = (
                references.category_codes(column)
                if isinstance(distribution, metrics.CategoricalReference)
                else column
            )
            has = len(column) >= p.min_decisions
            entry["psi"][name] = distribution.psi(values) if has else math.nan
            entry["missing_ratio"][name] = (
                float(np.isnan(column).mean()) if len(column) else math.nan
            )
        entry["reference"] = {
            "period": list(ref.period),
            "decision_rates": ref.decision_rates,
            "quality": ref.quality.to_dict() if ref.quality is not None else None,
        }
    report.hourly[version] = _over_time(rows)
    return entry


def _feature_matrix(
    rows: pd.DataFrame, orders: Mapping[str, tuple[str, ...]], names: tuple[str, ...]
) -> np.ndarray:
    """The rows' features in ``names`` order, NaN where missing (rows of an unknown feature
    order are left out)."""
    out: list[list[float]] = []
    for vector, schema, missing in zip(
        rows["features"], rows["feature_schema"], rows["missing_features"], strict=True
    ):
        order = orders.get(schema) if schema is not None else None
        if order is None or vector is None or len(vector) != len(order):
            continue
        values = [float(v) for v in vector]
        for i in missing if missing is not None else ():
            if 0 <= i < len(values):
                values[i] = math.nan
        named = dict(zip(order, values, strict=True))
        out.append([named.get(n, math.nan) for n in names])
    return np.asarray(out, dtype=np.float64).reshape(len(out), len(names))


def _cohorts(
    rows: pd.DataFrame,
    decided: np.ndarray,
    fraud: np.ndarray,
    labelled: np.ndarray,
    scores: np.ndarray,
    now: datetime,
    p: ReportParams,
) -> list[dict[str, Any]]:
    """Figures per decision day (UTC), each marked matured once the day is past the delay."""
    days = pd.to_datetime(rows["decided_us"].to_numpy(), unit="us", utc=True).floor("D")
    out = []
    for day in sorted(set(days)):
        mask = np.asarray(days == day)
        figures = _figures(decided[mask], fraud[mask], labelled[mask], scores[mask])
        matured = day + pd.Timedelta(days=1) + pd.Timedelta(p.label_delay) <= pd.Timestamp(now)
        out.append(
            {"day": day.date().isoformat(), "decisions": int(mask.sum()), "matured": bool(matured)}
            | figures
        )
    return out


def _over_time(rows: pd.DataFrame) -> pd.DataFrame:
    """Decisions per hour (per day beyond three days) and decision."""
    at = pd.to_datetime(rows["decided_us"].to_numpy(), unit="us", utc=True)
    span = (at.max() - at.min()) if len(at) else pd.Timedelta(0)
    period = "D" if span > pd.Timedelta(days=3) else "h"
    counts = pd.crosstab(at.floor(period), rows["decision"].to_numpy())
    return counts.reindex(columns=list(_DECISIONS), fill_value=0)


def _shadow(rows: pd.DataFrame, known: _Known, p: ReportParams) -> dict[str, Any]:
    """A shadow version's scores against its reference and its agreement with the answers."""
    scores = rows["shadow_score"].to_numpy(dtype=np.float64)
    t = known.metadata.thresholds
    shadow = np.where(
        scores >= t.decline, "decline", np.where(scores >= t.review, "review", "approve")
    )
    answered = rows["decision"].to_numpy(dtype=object)
    psi = math.nan
    if known.reference is not None and len(scores) >= p.min_decisions:
        psi = known.reference.score.psi(scores)
    return {
        "decisions": len(rows),
        "psi": {"score": psi},
        "agreement": float(np.mean(shadow == answered)),
        "decision_rates": {d: float(np.mean(shadow == d)) for d in _DECISIONS},
    }


# -- output -----------------------------------------------------------------------------------


def _rule_lines(rules: list[dict[str, Any]]) -> list[str]:
    if not rules:
        return []
    lines = [
        "## The fraud team's rules",
        "",
        "| rule | mode | action | fires | fire ratio | frauds | good | precision |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rules:
        lines.append(
            f"| {r['name']} | {r['mode']} | {r['action']} | {r['fires']:,} | "
            f"{_num(r['fire_ratio'])} | {r['frauds']:,} | {r['goods']:,} | {_num(r['precision'])} |"
        )
    return [*lines, ""]


def markdown(report: Report, pngs: Mapping[str, str] | None = None) -> str:
    """The report as Markdown (tables; image links when ``pngs`` names them)."""
    p = report.params
    lines = [
        "# fraudmesh monitor report",
        "",
        f"Generated {report.generated_at.isoformat()}; window "
        f"{_iso(p.since) or 'start of the log'} → {_iso(p.until) or 'now'}; label delay "
        f"{p.label_delay / timedelta(days=1):g} days.",
        "",
    ]
    if not report.versions:
        lines.append("No decisions in the window.")
    for version, v in report.versions.items():
        lines += [f"## Version {version}", ""]
        if v["decisions"]:
            lines += _answered_lines(v)
        shadow = v.get("shadow")
        if shadow is not None:
            lines += [
                f"As a shadow: {shadow['decisions']:,} scores, agreement with the answers "
                f"{shadow['agreement']:.2%}, score PSI {_num(shadow['psi']['score'])}.",
                "",
            ]
        if pngs and version in pngs:
            lines += [f"![version {version}]({pngs[version]})", ""]
    lines += _rule_lines(report.rules)
    lines += ["## Retraining advice", ""]
    if not report.advice:
        lines.append("None in the window.")
    for entry in report.advice:
        lines.append(
            f"- {entry.get('at')}: version {entry.get('model_version')}, "
            f"{entry.get('reason')}: `{json.dumps(entry.get('figures'))}`"
        )
    return "\n".join(lines) + "\n"


def _answered_lines(v: Mapping[str, Any]) -> list[str]:
    """A version's decisions: quality by labelling, reference rates, drift, cohorts by day."""
    lines: list[str] = []
    rates = v["decision_rates"]
    lines += [
        f"{v['decisions']:,} decisions (approve {rates['approve']:.2%}, review "
        f"{rates['review']:.2%}, decline {rates['decline']:.2%}); {v['labelled']:,} "
        f"labelled, {v['frauds']:,} frauds.",
        "",
        "| labelling | decisions | labelled | frauds | precision@review | "
        "recall@review | precision@decline | recall@decline | avg precision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, figures in (
        ("retraining's rule", v),
        ("matured cohorts", v["matured"]),
        ("immature cohorts", v["immature"]),
    ):
        lines.append(
            f"| {name} | {figures.get('decisions', v['decisions']):,} | "
            f"{figures['labelled']:,} | {figures['frauds']:,} | "
            + " | ".join(
                _with_interval(figures, k)
                for k in (
                    "precision_at_review",
                    "recall_at_review",
                    "precision_at_decline",
                    "recall_at_decline",
                )
            )
            + f" | {_num(figures['average_precision'])} |"
        )
    lines.append("")
    reference = v.get("reference")
    if reference is not None:
        r = reference["decision_rates"]
        lines += [
            f"Reference ({reference['period'][0]} → {reference['period'][1]}): approve "
            f"{r['approve']:.2%}, review {r['review']:.2%}, decline {r['decline']:.2%}.",
            "",
        ]
    if v["psi"]:
        ranked = sorted(v["psi"].items(), key=lambda kv: -_sortable(kv[1]))
        lines += ["| feature | PSI | missing |", "|---|---|---|"]
        for name, value in ranked:
            missing = v["missing_ratio"].get(name, math.nan)
            lines.append(f"| {name} | {_num(value)} | {_num(missing, '.1%')} |")
        lines.append("")
    lines += [
        "| day | matured | decisions | labelled | frauds | precision@review | recall@review |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in v["cohorts"]:
        lines.append(
            f"| {c['day']} | {'yes' if c['matured'] else 'no'} | {c['decisions']:,} | "
            f"{c['labelled']:,} | {c['frauds']:,} | "
            f"{_with_interval(c, 'precision_at_review')} | "
            f"{_with_interval(c, 'recall_at_review')} |"
        )
    lines.append("")
    return lines


def _num(value: float | None, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def _sortable(value: float | None) -> float:
    return -1.0 if value is None or math.isnan(value) else value


def _with_interval(figures: Mapping[str, Any], key: str) -> str:
    low, high = figures["intervals"][key]
    value = figures[key]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def plot(report: Report, version: str, path: Path) -> Path:
    """One version's PNG: live vs reference score bins, PSI per feature, live precision and
    recall by decision day with intervals, decisions over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = report.versions[version]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    if version in report.score_bins:
        ref, live = report.score_bins[version]
        x = np.arange(len(ref))
        ax.bar(x - 0.2, ref, 0.4, label="reference")
        ax.bar(x + 0.2, live, 0.4, label="live")
        ax.set_xlabel("score bin (reference quantiles; last: missing)")
        ax.legend()
    ax.set_title(f"score distribution, PSI {_num(v['psi'].get('score'))}")
    ax = axes[0][1]
    ranked = sorted(v["psi"].items(), key=lambda kv: -_sortable(kv[1]))[:15]
    if ranked:
        names = [n for n, _ in ranked][::-1]
        values = [_sortable(x) for _, x in ranked][::-1]
        ax.barh(names, values)
        for limit in (0.1, 0.2):
            ax.axvline(limit, linestyle="--", color="grey")
    ax.set_title("PSI against the reference (top 15)")
    ax = axes[1][0]
    cohorts = v["cohorts"]
    for key, colour in (("precision_at_review", "C0"), ("recall_at_review", "C1")):
        days = [c["day"] for c in cohorts]
        est = [_sortable(c[key]) for c in cohorts]
        low = [c["intervals"][key][0] for c in cohorts]
        high = [c["intervals"][key][1] for c in cohorts]
        ax.plot(days, est, "o-", color=colour, label=key.replace("_", " "))
        ax.fill_between(days, low, high, color=colour, alpha=0.2)
    ax.set_ylim(0, 1)
    ax.set_title("live quality by decision day (95 % Wilson)")
    ax.legend()
    ax.tick_params(axis="x", rotation=45)
    ax = axes[1][1]
    over_time = report.hourly.get(version)
    if over_time is not None and len(over_time):
        shares = over_time.div(over_time.sum(axis=1), axis=0)
        for decision in ("review", "decline"):
            ax.plot(shares.index, shares[decision], "o-", label=decision)
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.tick_params(axis="x", rotation=45)
    ax.set_title("decision rates over time")
    fig.suptitle(f"version {version}: {v['decisions']:,} decisions")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write(report: Report, out: Path) -> dict[str, Path]:
    """Writes ``monitor.json``, ``monitor.md`` and a PNG per version into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = {
        version: plot(report, version, out / f"monitor-v{version}.png").name
        for version, v in report.versions.items()
        if v["decisions"]
    }
    (out / "monitor.json").write_text(json.dumps(report.to_json(), indent=2))
    (out / "monitor.md").write_text(markdown(report, pngs))
    return {"json": out / "monitor.json", "markdown": out / "monitor.md"} | {
        f"png {v}": out / name for v, name in pngs.items()
    }
