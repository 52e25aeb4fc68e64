"""``fraudmesh rules …``: check, publish, promote and roll back the fraud team's policy.

A policy (docs/controls.md) is published as a numbered candidate in the state folder's
``policy/`` folder, promoted to live, and rolled back to what was live before; every
gateway follows the live version within a poll, without a restart. Exit status 2: bad
input (a policy that does not check, naming the rule and the field; an unknown version; a
corrupt state file); 1: a refusal (nothing to roll back to, the version is already live).
Either way one line on stderr says why and nothing was changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from services.cli import backtest as backtest_cli
from services.cli.exits import BAD_INPUT, REFUSED, fail
from services.cli.policyfile import read_policy_file
from services.common.errors import FailedPrecondition, FraudmeshError, InvalidArgument, NotFound
from services.domain import policy as policy_domain
from services.featurestore.settings import from_env
from services.models.policies import (
    POLICY_DIR,
    CorruptPolicyState,
    PolicyState,
    PolicyStore,
)

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

VarDirOption = Annotated[
    Path | None,
    typer.Option(help="State folder; default FRAUD_FEATURES_VAR_DIR or var."),
]
PolicyDirOption = Annotated[
    Path | None, typer.Option(help="Folder of policy versions; default <var-dir>/policy.")
]
FileArgument = Annotated[Path, typer.Argument(help="Policy file (YAML, docs/controls.md).")]


def _store(var_dir: Path | None, policy_dir: Path | None) -> PolicyStore:
    return PolicyStore(policy_dir or from_env(var_dir=var_dir).var_dir / POLICY_DIR)


def _refuse(action: str, error: Exception) -> NoReturn:
    """One line naming why ``action`` was not done: bad input (2) or a refusal (1)."""
    if isinstance(error, policy_domain.PolicyError):
        fail(f"{action} rejected", str(error), BAD_INPUT)
    if isinstance(error, InvalidArgument | NotFound | CorruptPolicyState):
        fail(f"{action} rejected", error.message, BAD_INPUT)
    if isinstance(error, FraudmeshError):
        fail(f"{action} refused", error.message, REFUSED)
    raise error


def _live_text(state: PolicyState) -> str:
    return f"policy v{state.live} live" if state.live else "no policy live (model decides)"


@app.command()
def validate(path: FileArgument) -> None:
    """Checks a policy file without publishing it."""
    text = read_policy_file(path, "validate")
    try:
        spec = policy_domain.parse(text)
    except policy_domain.PolicyError as error:
        _refuse("validate", error)
    shadow = sum(r.mode is policy_domain.Mode.SHADOW for r in spec.rules)
    console.print(f"valid: {len(spec.rules) - shadow} live rules, {shadow} in shadow")


@app.command()
def publish(
    path: FileArgument, var_dir: VarDirOption = None, policy_dir: PolicyDirOption = None
) -> None:
    """Checks a policy file and stores it as the next version, a candidate (not live)."""
    text = read_policy_file(path, "publish")
    try:
        version = _store(var_dir, policy_dir).publish(text)
    except (policy_domain.PolicyError, FraudmeshError) as error:
        _refuse("publish", error)
    console.print(
        f"published policy v{version} as a candidate: `fraudmesh rules promote {version}`"
    )


@app.command("list")
def list_command(var_dir: VarDirOption = None, policy_dir: PolicyDirOption = None) -> None:
    """Published versions, which is live, and the recent changes."""
    store = _store(var_dir, policy_dir)
    try:
        rows, state = store.listing(), store.read_state()
    except FraudmeshError as error:
        _refuse("list", error)
    table = Table("version", "state", "live rules", "shadow rules")
    for row in rows:
        table.add_row(row.version, row.state, str(row.rules), str(row.shadow))
    console.print(table)
    console.print(_live_text(state))
    for change in state.history[-10:]:
        console.print(f"  {change.action} v{change.version or '-'} by {change.actor}")


@app.command()
def promote(
    version: Annotated[str, typer.Argument(help="Policy version, e.g. 2.")],
    var_dir: VarDirOption = None,
    policy_dir: PolicyDirOption = None,
) -> None:
    """Makes a published version live on every gateway within a poll."""
    try:
        state = _store(var_dir, policy_dir).promote(version)
    except (policy_domain.PolicyError, FraudmeshError) as error:
        _refuse("promote", error)
    console.print(f"{_live_text(state)}; gateways follow within a second, no restart needed")


@app.command()
def rollback(var_dir: VarDirOption = None, policy_dir: PolicyDirOption = None) -> None:
    """Makes live again what was live before (possibly no policy)."""
    try:
        state = _store(var_dir, policy_dir).rollback()
    except FraudmeshError as error:
        _refuse("rollback", error)
    console.print(f"rolled back: {_live_text(state)}")


@app.command()
def show(
    version: Annotated[str | None, typer.Argument(help="Policy version; default live.")] = None,
    var_dir: VarDirOption = None,
    policy_dir: PolicyDirOption = None,
) -> None:
    """Prints a version's policy as it was published (the live one by default)."""
    store = _store(var_dir, policy_dir)
    try:
        wanted = version or store.read_state().live
        if wanted is None:
            raise FailedPrecondition("no policy is live")
        text = store.text(wanted)
    except FraudmeshError as error:
        _refuse("show", error)
    typer.echo(text, nl=not text.endswith("\n"))


app.command("backtest")(backtest_cli.command)
