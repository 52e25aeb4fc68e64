"""``fraudmesh monitor report``: drift, decision rates and live quality from the decision log."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from services.cli.decisions import VarDirOption, _root, _utc
from services.models.settings import ModelServerSettings
from services.monitor.settings import MonitorSettings

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

_TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]


@app.command()
def report(
    since: Annotated[
        datetime | None,
        typer.Option(formats=_TIME_FORMATS, help="First decided_at judged (UTC, inclusive)."),
    ] = None,
    until: Annotated[
        datetime | None,
        typer.Option(formats=_TIME_FORMATS, help="End of the window (UTC, exclusive)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the figures as JSON instead of Markdown.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder to write monitor.md, monitor.json and a PNG per version to."),
    ] = None,
    var_dir: VarDirOption = None,
    model_root: Annotated[
        Path | None, typer.Option(help="Folder of published models; default <var-dir>/models.")
    ] = None,
    label_delay_days: Annotated[
        float,
        typer.Option(
            min=0, help="A decision without an outcome is genuine once this old (retraining's)."
        ),
    ] = MonitorSettings.model_fields["label_delay_s"].default / 86_400,
) -> None:
    """Drift against each version's reference, decision rates and live precision and recall
    (matured and immature cohorts apart), computed from the decision log."""
    from services.pipelines import monitoring

    since, until = _utc(since), _utc(until)
    if since is not None and until is not None and since >= until:
        raise typer.BadParameter("must be after --since", param_hint="--until")
    log_root = _root(var_dir, None)
    if not log_root.is_dir():
        console.print(f"[red]no decision log in {log_root}[/red]")
        raise typer.Exit(1)
    models = model_root or (
        ModelServerSettings(var_dir=var_dir).models_path
        if var_dir is not None
        else MonitorSettings().models_path
    )
    monitor = MonitorSettings(var_dir=var_dir) if var_dir is not None else MonitorSettings()
    params = monitoring.ReportParams(
        since=since,
        until=until,
        now=datetime.now(UTC),
        label_delay=timedelta(days=label_delay_days),
        min_decisions=monitor.min_decisions,
    )
    result = monitoring.build(
        log_root, models, monitor.model_name, params, advice_file=monitor.advice_file
    )
    if out is not None:
        written = monitoring.write(result, out)
        if not json_out:
            for what, path in written.items():
                console.print(f"wrote {what}: {path}")
    if json_out:
        print(json.dumps(result.to_json(), indent=2))
    elif out is None:
        print(monitoring.markdown(result), end="")
