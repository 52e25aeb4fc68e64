"""Subcommands whose modules are imported only when they run.

Each of ``fraudmesh``'s command modules brings its own dependencies: ``decisions`` imports
Arrow datasets and pandas, ``lists`` the Redis client, ``up`` the mesh. Imported together at
start they cost every invocation seconds, ``fraudmesh rules promote`` as much as
``fraudmesh decisions export``. ``LazyGroup`` names the commands up front and imports a
command's module the first time the command is looked up: to run it, to list it in the help,
or to suggest it for a mistyped name. The command itself is built by Typer from the same
``Typer`` app or function as an eager registration would be, so its options, help and errors
are the same.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import typer

from services.cli.exits import OneLineErrors

if TYPE_CHECKING:
    # Typer's own copy of click, as in exits.py.
    from typer._click.core import Command, Context


@dataclass(frozen=True, slots=True)
class Lazy:
    """A command named before its module is imported."""

    module: str
    """The module that defines it."""
    attribute: str
    """A ``typer.Typer`` (a group of commands) or a command function in that module."""
    help: str | None = None
    """Its help line; None keeps the function's docstring, as ``app.command()`` would."""


def build(name: str, entry: Lazy) -> Command:
    """Imports ``entry``'s module and builds the command as Typer would have at start."""
    target = getattr(importlib.import_module(entry.module), entry.attribute)
    holder = typer.Typer()
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name, help=entry.help)
    else:
        holder.command(name, help=entry.help)(target)
    # A callback makes the holder a group even with one command, so the command keeps its name.
    holder.callback()(_nothing)
    built = typer.main.get_group(holder).commands[name]
    return built


def _nothing() -> None:
    """The holder's callback: it only makes the holder a group."""


class LazyGroup(OneLineErrors):
    """A root group whose ``lazy`` commands are imported on first lookup.

    Subclasses set ``lazy``; commands registered on the Typer app itself stay eager. Help
    lists the lazy commands first, in the table's order, then the eager ones.
    """

    lazy: ClassVar[Mapping[str, Lazy]] = {}

    def list_commands(self, ctx: Context) -> list[str]:
        """Every command's name, lazy or not."""
        eager = super().list_commands(ctx)
        return [*self.lazy, *(name for name in eager if name not in self.lazy)]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The command named, imported now if it is lazy and not yet loaded. An unknown name
        loads them all, so that the error can suggest the closest one."""
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        entry = self.lazy.get(cmd_name)
        if entry is not None:
            return self._load(cmd_name, entry)
        for name, other in self.lazy.items():
            if name not in self.commands:
                self._load(name, other)
        return None

    def _load(self, name: str, entry: Lazy) -> Command:
        command = build(name, entry)
        self.add_command(command, name)
        return command
