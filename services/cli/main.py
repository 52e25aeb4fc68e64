"""The ``fraudmesh`` command: run the mesh, score a transaction, train, manage features.

This package is the composition root: it may import every part of fraudmesh, and nothing
imports it. Commands that live outside the product (the load-test suite's ``loadtest``
and ``chaos``) join through the ``fraudmesh.commands`` entry-point group: each entry
point names a function that takes this Typer app and adds its commands, so the product
never imports the load-test package; it is loaded only when installed beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, ClassVar

import grpc
import typer
from rich.console import Console

from services import client
from services.cli.lazy import Lazy, LazyGroup


class _Commands(LazyGroup):
    """``fraudmesh``'s commands: each module is imported when its command runs (lazy.py)."""

    lazy: ClassVar[Mapping[str, Lazy]] = {
        "features": Lazy(
            "services.cli.features", "app", "Simulate data, apply and materialize Feast."
        ),
        "decisions": Lazy(
            "services.cli.decisions", "app", "Export, follow and compact the decision log."
        ),
        "data": Lazy("services.cli.data", "app", "Import your own transaction history."),
        "model": Lazy(
            "services.cli.model",
            "app",
            "List model versions; shadow, canary, promote, roll back or retire one.",
        ),
        "monitor": Lazy(
            "services.cli.monitor",
            "app",
            "Drift, decision rates and live quality of each model version.",
        ),
        "lists": Lazy(
            "services.cli.lists",
            "app",
            "Block and allow lists of cards, card prefixes, merchants, terminals "
            "(docs/controls.md).",
        ),
        "rules": Lazy(
            "services.cli.rules",
            "app",
            "Check, publish, promote and roll back the fraud team's policy (docs/controls.md).",
        ),
        "train": Lazy(
            "services.cli.train",
            "train_command",
            "Train, evaluate, export to ONNX, check parity and publish a model.",
        ),
        "autopilot": Lazy(
            "services.cli.autopilot",
            "autopilot_command",
            "Retrain when due and roll the candidate out through the monitor's gates.",
        ),
        "certs": Lazy("services.cli.certs", "certs_command"),
        "token": Lazy("services.cli.certs", "token_command"),
        "up": Lazy("services.cli.up", "up"),
    }


app = typer.Typer(
    name="fraudmesh",
    cls=_Commands,
    help="Real-time fraud scoring mesh: Envoy, gateway, Feast features, ONNX scorer.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    # Makes the app a group however few of its commands are eager: Typer runs an app of one
    # command and no callback as that command.
    pass


console = Console()


@app.command()
def score(
    card_id: Annotated[str, typer.Option(help="Card to charge.")],
    merchant_id: Annotated[str, typer.Option(help="Merchant paid.")],
    amount_minor: Annotated[
        int, typer.Option(min=0, help="Amount in minor units (cents); 0 verifies the card.")
    ],
    currency: Annotated[str, typer.Option(help="ISO 4217 code.")] = "EUR",
    card_not_present: Annotated[bool, typer.Option(help="E-commerce / card not present.")] = False,
    target: Annotated[str, typer.Option(help="Envoy (or gateway) host:port.")] = "127.0.0.1:8080",
    timeout_ms: Annotated[float, typer.Option(help="Client deadline in ms.")] = 42.0,
    tls: Annotated[bool, typer.Option("--tls", help="Connect over TLS.")] = False,
    ca: Annotated[
        Path | None, typer.Option(help="CA that signed the edge's certificate (implies --tls).")
    ] = None,
    cert: Annotated[
        Path | None, typer.Option(help="Client certificate for mutual TLS (implies --tls).")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="Private key of --cert.")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="FRAUDMESH_TOKEN",
            show_default=False,
            help="Bearer token (prefer the FRAUDMESH_TOKEN variable or --token-file: "
            "a command-line argument is visible to other users of the machine).",
        ),
    ] = None,
    token_file: Annotated[Path | None, typer.Option(help="File holding the bearer token.")] = None,
) -> None:
    """Score one transaction and print the answer."""
    sample = client.Sample(
        "cli", card_id, merchant_id, amount_minor, currency, card_not_present=card_not_present
    )
    if token_file is not None:
        token = token_file.read_text().strip()
    try:
        credentials = client.Credentials(
            tls=tls or ca is not None or cert is not None,
            ca_path=ca,
            cert_path=cert,
            key_path=key,
            token=token,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    try:
        response = client.score(target, sample.request(), timeout_ms / 1000, credentials)
    except grpc.RpcError as error:
        console.print(f"[red]{error.code().name}[/red]: {error.details()}")
        raise typer.Exit(1) from error
    except grpc.FutureTimeoutError as error:
        console.print(f"[red]cannot reach {target}[/red]")
        raise typer.Exit(1) from error
    console.print(client.describe(response))


COMMANDS_GROUP = "fraudmesh.commands"
"""Entry-point group of the functions that add commands to ``app`` (see the module doc)."""


def _add_installed_commands() -> None:
    for entry in entry_points(group=COMMANDS_GROUP):
        entry.load()(app)


def main() -> None:
    """Console-script entry point.

    Once the command has ended and its output is flushed, the process ends with ``os._exit``
    and the command's status, without the interpreter's finalization: a native library's
    thread that calls back into Python while the interpreter finalizes (Arrow's CSV
    read-ahead, still reading after a file was rejected midway) makes Python end that thread
    inside C++ code, which aborts the whole process (SIGABRT, "terminate called without an
    active exception") instead of exiting with the command's status.
    """
    _add_installed_commands()
    try:
        app()
        code = 0
    except SystemExit as done:
        code = _exit_status(done.code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_status(code: object) -> int:
    """The process status of a ``SystemExit`` code (a message is printed and gives 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
