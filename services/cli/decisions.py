"""``fraudmesh decisions …``: export the decision log joined with outcomes, follow it, compact it."""

from __future__ import annotations

import json
import signal
import threading
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import typer
from rich.console import Console
from rich.table import Table

from services.cli import checks
from services.cli.exits import REFUSED, fail
from services.decisionlog.settings import DecisionLogSettings
from services.domain import money
from services.pipelines import decisions as reader

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

_TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]

VarDirOption = Annotated[
    Path | None,
    typer.Option(
        help="State folder; the log is <var-dir>/decisions (default FRAUD_DECISIONLOG_*)."
    ),
]
RootOption = Annotated[
    Path | None,
    typer.Option(help="The decision log's folder itself (overrides --var-dir)."),
]


def _root(var_dir: Path | None, root: Path | None) -> Path:
    """The log folder: --root, else <--var-dir>/decisions, else the sink's settings."""
    if root is not None:
        return root
    if var_dir is not None:
        return DecisionLogSettings(var_dir=var_dir, root=None).root_path
    return DecisionLogSettings().root_path


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@app.command()
def export(
    out: Annotated[Path, typer.Option(help="Parquet file to write.")],
    since: Annotated[
        datetime | None,
        typer.Option(formats=_TIME_FORMATS, help="First decided_at kept (UTC, inclusive)."),
    ] = None,
    until: Annotated[
        datetime | None,
        typer.Option(formats=_TIME_FORMATS, help="End of the window (UTC, exclusive)."),
    ] = None,
    wide: Annotated[
        bool, typer.Option(help="Also one float column per feature (f_<name>), for training.")
    ] = False,
    var_dir: VarDirOption = None,
    root: RootOption = None,
) -> None:
    """Write the decisions, one per transaction, joined with their latest outcome."""
    log_root = _root(var_dir, root)
    since, until = _utc(since), _utc(until)
    checks.ordered(("--since", since), ("--until", until))
    checks.output_file("--out", out)
    if not log_root.is_dir():
        what = "is a file, not a folder" if log_root.exists() else "does not exist"
        fail("export rejected", f"the decision log {log_root} {what} (--root or --var-dir)")
    try:
        with console.status("reading the decision log …"):
            summary = reader.export(log_root, out, since, until, wide=wide)
    except pa.ArrowInvalid as error:  # a part that is not Parquet, or not the log's schema
        fail("export rejected", f"a part of the decision log in {log_root} is corrupt: {error}")
    except OSError as error:
        fail("export failed", f"reading {log_root} or writing {out}: {error}", REFUSED)
    table = Table(title=f"exported to {out}", show_header=False)
    table.add_row("decisions (one per transaction)", f"{summary.decisions:,}")
    table.add_row("  with an outcome", f"{summary.with_outcome:,}")
    table.add_row(
        "retried transactions dropped (first decision kept)", f"{summary.retried_transactions:,}"
    )
    table.add_row("duplicate events dropped", f"{summary.duplicate_events:,}")
    table.add_row("outcome events read", f"{summary.outcomes:,}")
    table.add_row("outcomes without a decision in the window", f"{summary.orphan_outcomes:,}")
    console.print(table)


def _format(landed: reader.Landed) -> str:
    row = landed.row
    if landed.kind == "outcomes":
        reported = row.get("reported_at")
        when = reported.isoformat() if isinstance(reported, datetime) else "-"
        return (
            f"{_stamp(row.get('received_at') or reported)} outcome  {row['transaction_id']}  "
            f"{row['outcome']}  source={row['outcome_source']}"
            + (f" by={row['reported_by']}" if row.get("reported_by") else "")
            + f"  reported_at={when}"
        )
    amount = _number(row.get("amount_minor"))
    currency = str(row.get("currency") or "")
    major = amount / money.minor_per_major(currency)
    shadow = row.get("shadow_score")
    shadow_text = f"  shadow={shadow:.3f}@{row.get('shadow_model_version')}" if shadow else ""
    return (
        f"{_stamp(row.get('decided_at'))} decision {row['transaction_id']}  "
        f"card={row['card_id']} merchant={row['merchant_id']}  {major:,.2f} {currency}  "
        f"{str(row['decision']).upper()} {_number(row.get('score')):.3f}  "
        f"by={row['scored_by']} features={row['feature_source']} "
        f"model={row['model_version']} route={row['route']}{shadow_text}"
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _stamp(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return "-"


def _json(landed: reader.Landed) -> str:
    return json.dumps({"kind": landed.kind[:-1], **landed.row}, default=str)


@app.command()
def tail(
    last: Annotated[
        int, typer.Option(min=0, help="Events already in the log to print first.")
    ] = 10,
    json_lines: Annotated[
        bool, typer.Option("--json", help="One JSON object per event instead of a line of text.")
    ] = False,
    interval_s: Annotated[
        float, typer.Option(min=0.01, max=3600, help="How often to look for new parts.")
    ] = 0.5,
    var_dir: VarDirOption = None,
    root: RootOption = None,
) -> None:
    """Follow the decision log: print decisions and outcomes as they land (Ctrl-C stops).

    Events land when the sink writes its next part (FRAUD_DECISIONLOG_FLUSH_INTERVAL_S:
    under 5 s after the decision by default)."""
    log_root = _root(var_dir, root)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    render = _json if json_lines else _format
    if not json_lines:
        console.print(f"following {log_root} (Ctrl-C stops)", style="dim")
    for landed in reader.follow(log_root, last=last, interval_s=interval_s, stop=stop.is_set):
        print(render(landed), flush=True)


@app.command()
def compact(
    older_than_days: Annotated[
        int,
        typer.Option(min=0, help="Merge the parts of day partitions at least this many days old."),
    ] = 2,
    var_dir: VarDirOption = None,
    root: RootOption = None,
) -> None:
    """Merge each closed day's small parts into one (safe beside a running sink)."""
    log_root = _root(var_dir, root)
    before = datetime.now(UTC).date() - timedelta(days=older_than_days - 1)
    summary = reader.compact(log_root, before if older_than_days > 0 else date.max)
    console.print(
        f"compacted {summary.days} day partition(s): {summary.parts_before} parts → "
        f"{summary.parts_after}, {summary.rows:,} rows, {summary.duplicates:,} duplicates dropped"
    )
