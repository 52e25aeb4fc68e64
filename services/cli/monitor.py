"""``fraudmesh monitor report``: drift, decision rates and live quality from the decision log."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from services.cli.decisions import VarDirOption, _root, _utc
from services.models.settings import ModelServerSettings
from services.monitor.settings import MonitorSettings

if TYPE_CHECKING:
    import grpc
    import pandas as pd

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


_DAYS = 28
"""The drill draws from the history's last four weeks (the population as it is now)."""


@app.command()
def drill(
    scenario: Annotated[
        str,
        typer.Option(
            help="none, shifted (larger amounts, card not present, abroad), new_merchants, "
            "new_fraud (inputs unchanged, more fraud) or dcc (another currency, same value)."
        ),
    ] = "shifted",
    count: Annotated[int, typer.Option(min=1, help="Transactions to send.")] = 3000,
    rate: Annotated[float, typer.Option(min=1, help="Calls a second.")] = 100.0,
    target: Annotated[str, typer.Option(help="Envoy (or gateway) host:port.")] = "127.0.0.1:8080",
    outcomes: Annotated[
        bool,
        typer.Option(
            help="Then report each drilled fraud as FRAUD and the rest as LEGITIMATE "
            "(the live quality figures move)."
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option(help="Seed of the draw: the same seed, the same traffic.")
    ] = 0,
    var_dir: VarDirOption = None,
) -> None:
    """Send reproducible drift through the mesh: transactions drawn from the history's last
    weeks, changed as the scenario says and moved into the last day at their time of day
    (services/pipelines/drift.py)."""
    import time

    import grpc

    rows = _drill_rows(scenario, count, seed, var_dir)
    start = time.monotonic()
    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=5)
        except grpc.FutureTimeoutError as error:
            console.print(f"[red]cannot reach {target}[/red]")
            raise typer.Exit(1) from error
        answered, failed = _send(channel, rows, rate)
        console.print(
            f"{scenario}: {len(answered):,} answered in {time.monotonic() - start:.1f} s"
            + (f", failed {failed}" if failed else "")
        )
        if outcomes:
            _report_outcomes(channel, answered)
            frauds = sum(answered.values())
            console.print(f"reported {len(answered):,} outcomes ({frauds:,} fraud)")


def _drill_rows(scenario: str, count: int, seed: int, var_dir: Path | None) -> pd.DataFrame:
    """The scenario's transactions, drawn from the history and moved into the last second."""
    import pandas as pd

    from services.featurestore import layout
    from services.featurestore.settings import FeatureStoreSettings
    from services.pipelines import drift as drift_scenarios

    if scenario not in drift_scenarios.SCENARIOS:
        raise typer.BadParameter(
            f"choose one of {', '.join(drift_scenarios.SCENARIOS)}", param_hint="--scenario"
        )
    store = FeatureStoreSettings(var_dir=var_dir) if var_dir else FeatureStoreSettings()
    path = store.data_path / layout.TRANSACTIONS_FILE
    if not path.is_file():
        console.print(f"[red]no transaction history at {path}: run `make data`[/red]")
        raise typer.Exit(1)
    history = pd.read_parquet(path)
    now = pd.Timestamp.now(tz="UTC")
    recent = history[history["timestamp"] > history["timestamp"].max() - pd.Timedelta(days=_DAYS)]
    return drift_scenarios.restamp(
        drift_scenarios.traffic(
            recent, scenario, count, seed, prefix=f"drill-{now.strftime('%Y%m%d%H%M%S')}"
        ),
        now - pd.Timedelta(seconds=1),
    )


def _send(
    channel: grpc.Channel, rows: pd.DataFrame, rate: float
) -> tuple[dict[str, bool], dict[str, int]]:
    """Scores ``rows`` at ``rate`` a second; (fraud verdict by answered id, failures by code)."""
    import time

    import grpc
    import pandas as pd

    from fraud.v1 import scoring_pb2 as pb
    from fraud.v1 import scoring_pb2_grpc as pb_grpc
    from services.domain import featurespec

    answered: dict[str, bool] = {}
    failed: dict[str, int] = {}
    stub = pb_grpc.FraudScoringStub(channel)
    pending = []
    start = time.monotonic()
    for i, row in enumerate(rows.itertuples(index=False)):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        request = pb.ScoreRequest(
            transaction_id=row.transaction_id, card_id=row.card_id,
            merchant_id=row.merchant_id, amount_minor=int(row.amount_minor),
            currency=row.currency,
            channel=pb.CHANNEL_CARD_NOT_PRESENT
            if row.channel == featurespec.CARD_NOT_PRESENT else pb.CHANNEL_CARD_PRESENT,
        )  # fmt: skip
        if isinstance(row.terminal_id, str):
            request.terminal_id = row.terminal_id
        request.timestamp.FromNanoseconds(pd.Timestamp(row.timestamp).value)
        pending.append((row, stub.Score.future(request, timeout=1.0)))
    for row, future in pending:
        try:
            future.result()
            answered[row.transaction_id] = bool(row.is_fraud)
        except grpc.RpcError as error:
            failed[error.code().name] = failed.get(error.code().name, 0) + 1
    return answered, failed


def _report_outcomes(channel: grpc.Channel, answered: dict[str, bool]) -> None:
    """Reports each answered transaction's verdict from the history as its outcome."""
    from fraud.v1 import outcomes_pb2, outcomes_pb2_grpc

    reporter = outcomes_pb2_grpc.OutcomeServiceStub(channel)
    for tid, fraud in answered.items():
        report = outcomes_pb2.ReportOutcomeRequest(
            transaction_id=tid,
            outcome=outcomes_pb2.OUTCOME_FRAUD if fraud else outcomes_pb2.OUTCOME_LEGITIMATE,
            source=outcomes_pb2.OUTCOME_SOURCE_ANALYST,
        )
        report.reported_at.GetCurrentTime()
        reporter.ReportOutcome(report, timeout=5.0)
