"""``fraudmesh lists …``: the fraud team's block and allow lists in the online store.

``add`` is idempotent (the same entry again changes nothing), ``remove`` takes an entry
off, ``show`` prints the entries with their reasons and expiries. Every gateway reads a
change at its next poll, without a restart (docs/controls.md). Exit status 2: bad input
(naming the field); 1: the store cannot be reached or the entry to remove is not there.
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
from services.domain.lists import ListKind, ListName, check_entry
from services.featurestore.lists import ListStore, add_entry, open_lists
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
    with _store(var_dir, "add") as store:
        changed = add_entry(store, kind, value, list_name, reason, expires, default_actor(), now)
    what = f"{kind.value} {value} on the {list_name.value} list"
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
