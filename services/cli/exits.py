"""How ``fraudmesh`` commands end on failure: one line on stderr and a documented exit status.

- ``BAD_INPUT`` (2): the input is wrong: a file that cannot be read as it claims to be, an
  option value out of range, an unknown model version, a corrupt state file. Nothing was
  changed. Typer's own usage errors (an unparseable number or date, a missing argument)
  exit with 2 as well, in Typer's format; checks Typer cannot express (``bad_option``) use
  its wording on one line.
- ``REFUSED`` (1): a valid request that cannot be carried out now: the model lifecycle does
  not allow the change, training or materialization failed, a service cannot be reached.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

BAD_INPUT = 2
"""Exit status of bad input (nothing changed)."""
REFUSED = 1
"""Exit status of a valid request that was refused or failed."""
LIMIT = 400
"""Longest message printed, in characters."""

_stderr = Console(stderr=True, soft_wrap=True, highlight=False)


def one_line(text: str, limit: int = LIMIT) -> str:
    """``text`` as one printable line (control characters escaped), cut to ``limit``."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"


def fail(what: str, message: str, code: int = BAD_INPUT) -> NoReturn:
    """Prints ``what: message`` as one line on stderr and exits with ``code``."""
    _stderr.print(f"[red]{escape(what)}:[/red] {escape(one_line(message))}")
    raise typer.Exit(code)


def bad_option(option: str, message: str) -> NoReturn:
    """Rejects an option's value in one line worded as Typer words its own (exit 2)."""
    fail(f"Invalid value for '{option}'", message, BAD_INPUT)
