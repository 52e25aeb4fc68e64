"""Checks of option values that Typer's types cannot express, made before a command does any
work: each failure is one line naming the option, exit 2, nothing done (``exits.bad_option``)."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

from services.cli.exits import bad_option


def ordered(*bounds: tuple[str, datetime | None], touching: tuple[str, str] | None = None) -> None:
    """The given bounds come in the order listed, each strictly after the one before, except
    the pair ``touching`` (the end of one period and the start of the next) which may be equal.
    Bounds left out (None) are skipped."""
    given = [(name, value) for name, value in bounds if value is not None]
    for (first, a), (second, b) in itertools.pairwise(given):
        equal_ok = touching == (first, second)
        if a > b or (a == b and not equal_ok):
            relation = "at or before" if equal_ok else "before"
            bad_option(
                second,
                f"{first} {a:%Y-%m-%d %H:%M} must come {relation} {second} {b:%Y-%m-%d %H:%M}",
            )


def output_file(option: str, path: Path | None) -> None:
    """A file written when the command ends: not a folder, and its folder can be created."""
    if path is None:
        return
    if path.is_dir():
        bad_option(option, f"{path} is a folder; name a file")
    _creatable(option, path.parent)


def output_folder(option: str, path: Path | None) -> None:
    """A folder written when the command ends: a folder already, or one that can be created."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        bad_option(option, f"{path} is a file, not a folder")
    _creatable(option, path)


def existing_folder(option: str, path: Path | None) -> None:
    """A folder that must exist already (one the command reads)."""
    if path is None:
        return
    if not path.exists():
        bad_option(option, f"{path} does not exist")
    if not path.is_dir():
        bad_option(option, f"{path} is a file, not a folder")


def _creatable(option: str, folder: Path) -> None:
    """``folder`` exists, or its nearest existing ancestor is a folder."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            if not candidate.is_dir():
                bad_option(option, f"{candidate} is a file, not a folder")
            return
