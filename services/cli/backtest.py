"""``fraudmesh rules backtest``: what a policy would have done to payments already decided.

The policy is a file (a candidate not yet published) or a published version; the payments
are the decision log joined with outcomes (``--source log``, the default), the imported
history (``--source history``) or both. Each rule and the whole policy are tallied by
``services.domain.backtest`` and printed as a table, or as JSON (``--json``, ``--out``).
Exit status 2 with one line on stderr: a policy that does not check, an unknown version, an
empty decision log, a log without outcomes, no history.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from services.cli.exits import BAD_INPUT, fail
from services.cli.policyfile import read_policy_file
from services.common import filecommit
from services.common.errors import FraudmeshError
from services.decisionlog.settings import DecisionLogSettings
from services.domain import backtest as domain
from services.domain import policy as policy_domain
from services.featurestore.settings import from_env
from services.models.policies import POLICY_DIR, PolicyStore

console = Console()

Source = Literal["log", "history", "both"]
_TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]


def _policy(target: str, var_dir: Path | None, policy_dir: Path | None) -> policy_domain.Policy:
    """The policy in file ``target``, else the published version ``target``."""
    path = Path(target)
    try:
        if path.is_file():
            return policy_domain.load(read_policy_file(path, "backtest"), path.stem)
        store = PolicyStore(policy_dir or from_env(var_dir=var_dir).var_dir / POLICY_DIR)
        return policy_domain.load(store.text(target), target)
    except policy_domain.PolicyError as error:
        fail("backtest rejected", str(error), BAD_INPUT)
    except FraudmeshError as error:
        fail("backtest rejected", f"{target!r} is no policy file: {error.message}", BAD_INPUT)


def _utc(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _table(title: str, report: domain.BacktestReport) -> Table:
    table = Table(
        "rule", "mode", "action", "fires", "frauds", "EUR", "goods hit", "EUR",
        "precision", "recall", "already flagged", "new frauds", title=title,
    )  # fmt: skip
    rows = [(r.name, r.mode, r.action, r.figures) for r in report.rules]
    rows += [("(policy: held)", "", "", report.policy)]
    if report.logged.fires.count:
        rows += [("(as logged: held)", "", "", report.logged)]
    for name, mode, action, f in rows:
        table.add_row(
            name, mode, action, str(f.fires.count), str(f.frauds.count),
            f"{f.frauds.amount_eur:,.2f}", str(f.goods.count), f"{f.goods.amount_eur:,.2f}",
            _ratio(f.precision), _ratio(f.recall), str(f.overlap.count), str(f.new_frauds.count),
        )  # fmt: skip
    return table


def as_json(report: domain.BacktestReport) -> dict[str, Any]:
    """The report as plain JSON values, with each figure's precision and recall."""

    def figures(f: domain.Figures) -> dict[str, Any]:
        return {**asdict(f), "precision": f.precision, "recall": f.recall}

    return {
        "version": report.version,
        "payments": report.payments,
        "frauds": asdict(report.frauds),
        "goods": asdict(report.goods),
        "unlabelled": report.unlabelled,
        "changed": report.changed,
        "unresolved": report.unresolved,
        "rules": [
            {"name": r.name, "mode": r.mode, "action": r.action, **figures(r.figures)}
            for r in report.rules
        ],
        "policy": figures(report.policy),
        "logged": figures(report.logged),
        "decisions": [asdict(r) for r in report.replayed],
    }


def _reports(
    policy: policy_domain.Policy, source: Source, since: datetime | None,
    until: datetime | None, var_dir: Path | None, log_root: Path | None,
) -> dict[str, domain.BacktestReport]:  # fmt: skip
    # Imported here: the log's reader brings Arrow datasets and pandas, which no other
    # ``fraudmesh rules`` command needs (services/cli/lazy.py).
    from services.decisionlog import payments as logged
    from services.pipelines import backtest as sources

    reports: dict[str, domain.BacktestReport] = {}
    try:
        if source in ("log", "both"):
            root = log_root or DecisionLogSettings(var_dir=var_dir, root=None).root_path
            payments, _ = logged.from_log(root, _utc(since), _utc(until))
            reports["log"] = domain.backtest(policy, payments)
        if source in ("history", "both"):
            history = sources.from_history(from_env(var_dir=var_dir))
            reports["history"] = domain.backtest(policy, history)
    except logged.BacktestSourceError as error:
        fail("backtest rejected", error.message, BAD_INPUT)
    return reports


def command(
    policy: Annotated[str, typer.Argument(help="Policy file, or a published version number.")],
    source: Annotated[
        str, typer.Option(help="log (decision log with outcomes), history, or both.")
    ] = "log",
    since: Annotated[
        datetime | None, typer.Option(formats=_TIME_FORMATS, help="First decided_at (UTC).")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(formats=_TIME_FORMATS, help="End (UTC, exclusive).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    out: Annotated[Path | None, typer.Option(help="Also write the JSON to this file.")] = None,
    var_dir: Annotated[Path | None, typer.Option(help="State folder (default var).")] = None,
    policy_dir: Annotated[Path | None, typer.Option(help="Default <var-dir>/policy.")] = None,
    log_root: Annotated[Path | None, typer.Option(help="The decision log's folder.")] = None,
) -> None:
    """Replays a policy over the decision log (with outcomes) and/or the imported history."""
    if source not in ("log", "history", "both"):
        fail("backtest rejected", f"--source must be log, history or both, not {source!r}")
    compiled = _policy(policy, var_dir, policy_dir)
    reports = _reports(compiled, source, since, until, var_dir, log_root)  # type: ignore[arg-type]
    document = {name: as_json(report) for name, report in reports.items()}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with filecommit.replacing(out) as tmp:
            tmp.write_text(json.dumps(document, indent=1))
    if json_out:
        typer.echo(json.dumps(document, indent=1))
        return
    for name, report in reports.items():
        console.print(_table(f"policy {report.version} over the {name}", report))
        console.print(
            f"{report.payments} payments ({report.frauds.count} frauds, {report.goods.count} "
            f"good, {report.unlabelled} unlabelled); answers changed: {report.changed}; "
            f"answer unknown without a rule (no answer logged, or no model score): "
            f"{report.unresolved}"
        )
