"""``fraudmesh data …``: bring your own transaction history.

``data import`` reads a CSV or Parquet file in the import schema, checks every row with
serving's rules, computes the feature tables with serving's aggregation, publishes the
dataset atomically, registers it with Feast and materializes the newest features into the
online store. Exit status 2 means the file or an option was rejected and nothing changed
(one line on stderr names the file, line, row, column or option); 1 means the dataset could
not be written or, once it was, registering or materializing it failed.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from services.cli.exits import BAD_INPUT, REFUSED, fail
from services.common.errors import FailedPrecondition
from services.featurestore.settings import from_env

if TYPE_CHECKING:
    from services.pipelines.dataimport import ImportOptions, ImportResult

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

REJECTED = BAD_INPUT
"""Exit status of an import that was rejected (nothing changed)."""
MAX_LABEL_DELAY_DAYS = 3_650.0
"""Longest default label delay accepted: chargebacks come within months, not decades."""


class FileFormat(enum.StrEnum):
    """Input formats."""

    csv = "csv"
    parquet = "parquet"


def _schema_help() -> str:
    # Kept in step with dataimport.SCHEMA (a unit test compares them) without importing
    # the pipeline (pandas, pyarrow) for every fraudmesh command.
    return (
        "Columns (rename yours with --map TARGET=SOURCE): "
        "transaction_id (required; string or integer, unique); "
        "timestamp (required; ISO 8601 with a zone, naive = UTC, or epoch seconds); "
        "card_id, merchant_id (required); "
        "amount (decimal, major units) or amount_minor (integer, minor units), one required; "
        "is_fraud (required; 0/1 or true/false); "
        "currency (ISO 4217, default EUR); channel (card_present, the default, or "
        "card_not_present); terminal_id (unique across merchants); fraud_reported_at (when "
        "the label became known; default timestamp + label delay); card_home_country, "
        "merchant_country (ISO 3166 numeric); merchant_category (MCC); fraud_scenario "
        "(reported as recall per scenario). Missing optional columns take serving's defaults."
    )


@app.command("import", help="Import a transaction history (CSV or Parquet). " + _schema_help())
def import_command(
    path: Annotated[Path, typer.Argument(help="The file (.csv, .csv.gz, .parquet).")],
    var_dir: Annotated[
        Path | None,
        typer.Option(
            help="State folder (data, Feast, models); default FRAUD_FEATURES_VAR_DIR or var."
        ),
    ] = None,
    file_format: Annotated[
        FileFormat | None, typer.Option("--format", help="Default: from the file name.")
    ] = None,
    map_: Annotated[
        list[str] | None,
        typer.Option(
            "--map",
            help="TARGET=SOURCE: the file's column SOURCE holds schema column TARGET "
            "(repeat for each, e.g. --map card_id=customer_ref --map amount=TX_AMOUNT).",
        ),
    ] = None,
    label_delay_days: Annotated[
        float,
        typer.Option(
            min=0,
            max=MAX_LABEL_DELAY_DAYS,
            help="Days from a transaction to its label, where fraud_reported_at is absent.",
        ),
    ] = 7.0,
    max_bad_rows: Annotated[
        int,
        typer.Option(
            min=0,
            help="Rows failing their checks that may be left out; one more rejects the file.",
        ),
    ] = 0,
    materialize: Annotated[
        bool,
        typer.Option(help="Register with Feast and load the newest features into the store."),
    ] = True,
) -> None:
    """Check, aggregate and publish a transaction history; then apply and materialize."""
    from services.cli.features import materialize_with_progress
    from services.featurestore import admin
    from services.pipelines import dataimport

    settings = from_env(var_dir=var_dir)
    started = time.perf_counter()
    options = dataimport.ImportOptions(
        format=file_format.value if file_format else None,
        label_delay=timedelta(days=label_delay_days),
        max_bad_rows=max_bad_rows,
    )
    _print_result(_import(path, settings.data_path, options, map_ or []))
    if not materialize:
        return
    try:
        with console.status("registering the feature views with Feast …"):
            admin.apply(settings)
        materialize_with_progress(settings, console)
    except FailedPrecondition as error:
        fail(
            "failed",
            f"{error}. The dataset is imported; the online store still holds the previous "
            "features: run `fraudmesh features materialize`.",
            REFUSED,
        )
    console.print(f"import done in {time.perf_counter() - started:.1f} s")


def _import(path: Path, data_dir: Path, options: ImportOptions, mapping: list[str]) -> ImportResult:
    """Imports with progress bars; a rejection or write failure ends the command."""
    from services.pipelines import dataimport

    try:
        options = replace(options, mapping=dataimport.parse_mapping(mapping))
        with _bars() as report:
            return dataimport.import_transactions(path, data_dir, options, report)
    except dataimport.ImportRejected as error:
        if error.bad_rows is not None:
            _print_bad_rows(error.bad_rows.lines(error.unit), title="rejected rows")
        fail("import rejected", str(error), REJECTED)
    except OSError as error:
        fail(
            "import failed",
            f"cannot write the dataset in {data_dir}: {error}; nothing was changed",
            REFUSED,
        )


@contextlib.contextmanager
def _bars() -> Iterator[_Report]:
    """Progress bars for the import's steps, as a callback for ``import_transactions``."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        yield _Report(progress)


_LABELS = {
    "read": "reading and checking rows",
    "features": "computing and writing card, merchant and terminal features",
}


class _Report:
    """Turns (step, done, total) calls into one progress bar per step."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, step: str, done: int, total: int) -> None:
        if step not in self._tasks:
            self._tasks[step] = self._progress.add_task(_LABELS.get(step, step), total=total)
        self._progress.update(self._tasks[step], completed=done, total=total)


def _print_bad_rows(lines: list[str], title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("reason")
    for line in lines:
        table.add_row(line)
    console.print(table)


def _print_result(result: ImportResult) -> None:
    console.print(
        f"imported {result.rows_imported:,} of {result.rows_read:,} rows "
        f"({result.frauds:,} frauds) from {result.source.name}: "
        f"{result.first:%Y-%m-%d %H:%M} → {result.last:%Y-%m-%d %H:%M} UTC"
    )
    if result.bad_rows.total:
        _print_bad_rows(
            result.bad_rows.lines(result.position_unit),
            title=f"{result.bad_rows.total:,} rows left out (within --max-bad-rows)",
        )
    mapped = {t: s for t, s in result.columns.items() if t != s}
    if mapped:
        console.print("columns: " + ", ".join(f"{t} ← {s}" for t, s in mapped.items()))
    if result.defaulted:
        console.print("defaults used for: " + ", ".join(result.defaulted))
    if result.ignored:
        console.print("ignored columns: " + ", ".join(result.ignored))
    steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in result.seconds.items())
    console.print(f"dataset published in {result.data_dir} → {result.version_dir.name} ({steps})")
