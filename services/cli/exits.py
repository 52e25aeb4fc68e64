"""How ``fraudmesh`` commands end on failure: one line on stderr and a documented exit status.

- ``BAD_INPUT`` (2): the input is wrong: a file that cannot be read as it claims to be, an
  option value out of range, an unknown model version, a corrupt state file. Nothing was
  changed. Usage errors (an unparseable number or date, an unknown option, a missing
  argument, and the checks Typer cannot express, ``bad_option``) are one line too, in
  Typer's wording after the command's name: ``fraudmesh train: Invalid value for '--seed': …``
  (``OneLineErrors``, the root command's class).
- ``REFUSED`` (1): a valid request that cannot be carried out now: the model lifecycle does
  not allow the change, training or materialization failed, a service cannot be reached.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

if TYPE_CHECKING:
    # The context class of the hooks overridden below: typer's own copy of click's (the
    # public ``typer.Context`` is a subclass, too narrow for an override).
    from typer._click.core import Context

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
    """Rejects an option's value as a usage error naming it (one line, exit 2)."""
    raise typer.BadParameter(message, param_hint=f"'{option}'")


_ARGS = "fraudmesh.cli.args"
"""Key in the context's ``meta`` of the arguments given to the root command."""


@contextmanager
def _usage_errors_in_one_line(command_path: str) -> Iterator[None]:
    """Prints a usage error raised inside as one line after the failing command's path."""
    try:
        yield
    except typer.TyperException as error:
        # A command called with no arguments shows its help by raising this usage error after
        # printing the help; typer keeps the class private, so it is known by its name.
        if type(error).__name__ == "NoArgsIsHelpError":
            raise
        where = getattr(getattr(error, "ctx", None), "command_path", command_path)
        fail(where, error.format_message(), error.exit_code)


class OneLineErrors(TyperGroup):
    """A root command whose usage errors, and those of every command under it, are one line.

    Typer prints a usage error as the usage line, a hint and a boxed message wrapped to the
    terminal; a script or an operator reading a log wants one line naming the command and the
    option. Every parse of a command under this group happens inside its ``make_context``
    (its own options) or ``invoke`` (the subcommands'), so catching there covers them all.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        """Parses the root's own options; a usage error prints as one line."""
        given = list(args)  # parsing consumes the list
        with _usage_errors_in_one_line(info_name or self.name or ""):
            ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta[_ARGS] = given
        return ctx

    def invoke(self, ctx: Context) -> Any:
        """Runs the subcommand named; its usage errors print as one line."""
        with _usage_errors_in_one_line(self._named_path(ctx)):
            return super().invoke(ctx)

    def _named_path(self, ctx: Context) -> str:
        """The path of the deepest command the arguments name (``fraudmesh model promote``).

        Some parse errors (an option missing its value) carry no context, so the command they
        belong to is read from the arguments."""
        words: list[str] = [ctx.command_path]
        command: object = self
        for word in ctx.meta.get(_ARGS, []):
            found = command.get_command(ctx, word) if isinstance(command, TyperGroup) else None
            if found is None:
                break
            words.append(word)
            command = found
        return " ".join(words)
