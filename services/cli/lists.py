"""``fraudmesh lists …``: the fraud team's block and allow lists in the online store.

``add`` is idempotent (the same entry again changes nothing), ``remove`` takes an entry
off, ``show`` prints the entries with their reasons and expiries. Every gateway reads a
change at its next poll, without a restart (docs/controls.md). Every change is audited on
the event log (a ``ListChangeEvent``; an add that changes nothing writes none). Exit status
2: bad input (naming the field); 1: the store cannot be reached, the entry to remove is not
there, or the change was made but its audit record could not be written.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import redis
import typer
from rich.console import Console
from rich.table import Table

from services.cli.exits import BAD_INPUT, REFUSED, fail
from services.common.errors import InvalidArgument
from services.domain.lists import ListEntry, ListKind, ListName, check_entry
from services.eventlog import EventLogError, EventLogSettings, audit
from services.featurestore.lists import ListStore, open_lists
from services.featurestore.settings import from_env
from services.models.lifecycle import default_actor

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

VarDirOption = Annotated[
    Path | None, typer.Option(help="State folder; default FRAUD_FEATURES_VAR_DIR or var.")
]
KindArgument = Annotated[ListKind, typer.Argument(help="What the entry names.")]
ValueArgument = Annotated[str, typer.Argument(help="The card, prefix, merchant or terminal.")]
ListOption = Annotated[ListName, typer.Option("--list", help="block (decline) or allow (approve).")]


@contextmanager
def _store(var_dir: Path | None, action: str) -> Iterator[ListStore]:
    settings = from_env(var_dir=var_dir)
    try:
        store = open_lists(settings)
        assert store is not None
    except (OSError, sqlite3.Error, redis.RedisError) as error:
        fail(f"{action} refused", f"cannot open the lists in the online store: {error}", REFUSED)
    try:
        yield store
    except (sqlite3.Error, redis.RedisError) as error:
        fail(f"{action} refused", f"the online store failed: {error}", REFUSED)
    finally:
        store.close()


def _audit(var_dir: Path | None, change: str, entry: ListEntry, generation: int) -> None:
    """Writes the change's audit record on the event log; exit 1 when it cannot."""
    settings = EventLogSettings(var_dir=var_dir) if var_dir is not None else EventLogSettings()
    envelope = audit.entry_change(change, entry, generation, entry.added_at_s)
    try:
        audit.write(settings, envelope)
    except (EventLogError, OSError) as error:
        fail(
            f"{change} made, audit failed",
            f"the change is in the lists but not on the event log: {error}",
            REFUSED,
        )


@app.command()
def add(
    kind: KindArgument,
    value: ValueArgument,
    reason: Annotated[str, typer.Option(help="Why (kept with the entry, shown in answers).")],
    list_name: ListOption = ListName.BLOCK,
    expires_in_s: Annotated[
        float | None, typer.Option(help="Seconds until the entry expires; default never.")
    ] = None,
    var_dir: VarDirOption = None,
) -> None:
    """Puts an entry on a list (idempotent: the same entry again changes nothing)."""
    now = time.time()
    expires = now + expires_in_s if expires_in_s is not None else None
    try:
        check_entry(kind, value, reason, expires, now)
    except InvalidArgument as error:
        fail("add rejected", error.message, BAD_INPUT)
    entry = ListEntry(kind, value, list_name, reason, expires, now, default_actor())
    with _store(var_dir, "add") as store:
        changed = store.add(entry)
        generation = store.generation() if changed else 0
    what = f"{kind.value} {value} on the {list_name.value} list"
    if changed:
        _audit(var_dir, "add", entry, generation)
    console.print(f"added {what}" if changed else f"unchanged: {what} already, as given")


@app.command()
def remove(
    kind: KindArgument,
    value: ValueArgument,
    list_name: ListOption = ListName.BLOCK,
    var_dir: VarDirOption = None,
) -> None:
    """Takes an entry off a list."""
    with _store(var_dir, "remove") as store:
        removed = store.remove(list_name, kind, value)
        generation = store.generation() if removed else 0
    if removed:
        gone = ListEntry(kind, value, list_name, "", None, time.time(), default_actor())
        _audit(var_dir, "remove", gone, generation)
    if not removed:
        fail(
            "remove refused", f"{kind.value} {value} is not on the {list_name.value} list", REFUSED
        )
    console.print(f"removed {kind.value} {value} from the {list_name.value} list")


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command()
def show(var_dir: VarDirOption = None) -> None:
    """Every entry: list, kind, value, reason, expiry (expired entries marked)."""
    with _store(var_dir, "show") as store:
        generation, entries = store.entries()
    now = time.time()
    table = Table("list", "kind", "value", "reason", "expires", "added by")
    for e in sorted(entries, key=lambda e: (e.list.value, e.kind.value, e.value)):
        expires = _when(e.expires_at_s) + ("" if e.live(now) else " (expired)")
        table.add_row(e.list.value, e.kind.value, e.value, e.reason, expires, e.actor)
    console.print(table)
    console.print(f"{len(entries)} entries (generation {generation})")
