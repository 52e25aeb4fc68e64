"""``fraudmesh model …``: list model versions and move them through their lifecycle.

Each command changes the lifecycle file beside the models (``routing.json``); every
gateway and scorer follows it within a fraction of a second, without a restart. Commands
print what changed. Exit status 1: the lifecycle does not allow the change (a refusal of a
valid request, with the reason); 2: bad input (an unknown version, a percent outside
0.01-100, a model name that is not a plain name, a corrupt ``routing.json``). Either way one
line on stderr says why and nothing was changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from services.cli.exits import BAD_INPUT, REFUSED, bad_option, fail
from services.common.errors import FraudmeshError, InvalidArgument, NotFound
from services.featurestore.settings import from_env
from services.models import repository
from services.models.lifecycle import (
    CorruptLifecycleFile,
    LifecycleChange,
    LifecycleState,
    ModelLifecycle,
    Routing,
)

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)
console = Console()

VarDirOption = Annotated[
    Path | None,
    typer.Option(help="State folder (data, Feast, models); default FRAUD_FEATURES_VAR_DIR or var."),
]
ModelRootOption = Annotated[
    Path | None, typer.Option(help="Folder of published models; default <var-dir>/models.")
]


def _plain_name(name: str) -> str:
    """Typer callback: a model name is one plain folder under the model root, nothing else
    (the repository's own rule)."""
    problem = repository.name_problem(name)
    if problem is not None:
        bad_option("--name", f"{problem} (e.g. fraud-lgbm)")
    return name


def _share(percent: float) -> float:
    """Typer callback: a canary share in percent, 0.01 to 100 (NaN and infinities too)."""
    if not 0 < round(percent, 2) <= 100:  # False for NaN; inf rounds to inf
        bad_option("--percent", f"{percent:g} is not a share from 0.01 to 100")
    return percent


NameOption = Annotated[str, typer.Option(help="Model name.", callback=_plain_name)]
VersionArgument = Annotated[str, typer.Argument(help="Model version, e.g. 3.")]


def _lifecycle(var_dir: Path | None, model_root: Path | None, name: str) -> ModelLifecycle:
    root = model_root or from_env(var_dir=var_dir).var_dir / "models"
    return ModelLifecycle(root, name)


def _routing_text(routing: Routing) -> str:
    parts = [f"live v{routing.live}" if routing.live else "no live version"]
    if routing.canary:
        parts.append(f"canary v{routing.canary.version} at {routing.canary.percent:g}%")
    if routing.shadow:
        parts.append(f"shadow v{routing.shadow}")
    if routing.previous:
        parts.append(f"rollback target v{routing.previous}")
    return ", ".join(parts)


def _print_change(change: LifecycleChange) -> None:
    for note in change.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
    if not change.changed:
        console.print(f"unchanged: {_routing_text(change.after)}")
        return
    for t in change.transitions:
        old = t.from_state.value if t.from_state else "new"
        console.print(f"v{t.version}: {old} → [bold]{t.to_state.value}[/bold] ({t.reason})")
    console.print(f"routing (generation {change.generation}): {_routing_text(change.after)}")
    console.print("gateways and scorers follow within a second; no restart needed")


def _run(action: str, call: Callable[[], LifecycleChange]) -> None:
    """Runs a lifecycle call, printing its change, or in one line why it was not made:
    bad input (exit 2) or a refusal of the lifecycle (exit 1)."""
    try:
        change = call()
    except (InvalidArgument, NotFound, CorruptLifecycleFile) as error:
        fail(f"{action} rejected", error.message, BAD_INPUT)
    except FraudmeshError as error:
        fail(f"{action} refused", error.message, REFUSED)
    _print_change(change)


def _metric(metadata: repository.ModelMetadata | None, name: str) -> str:
    if metadata is None or name not in metadata.metrics:
        return "-"
    return f"{metadata.metrics[name]:.4f}"


def _source_text(metadata: repository.ModelMetadata | None) -> str:
    """What a version retrained from the decision log was trained on; "" for others."""
    m = metadata.metrics if metadata is not None else {}
    if "source_decision_rows" not in m:
        return ""
    return (
        f"trained on the history and {m['source_decision_rows']:,.0f} payments from the "
        f"decision log ({m.get('source_labelled_by_outcome', 0):,.0f} labelled by outcomes; "
        f"{m.get('source_frauds', 0):,.0f} frauds in {m.get('source_rows', 0):,.0f} payments)"
    )


def _print_list(state: LifecycleState, root: Path, history: int) -> None:
    table = Table(title=f"{state.name} in {root} (generation {state.generation})")
    for column in ("version", "state", "traffic", "pr_auc", "recall@1%fpr", "gates", "created"):
        table.add_column(column, justify="left" if column in ("state", "gates") else "right")
    records = sorted(
        state.versions.values(),
        key=lambda r: (int(r.version), r.version) if r.version.isdigit() else (1 << 62, r.version),
    )
    loaded: dict[str, repository.ModelMetadata] = {}
    for record in records:
        try:
            metadata, _ = repository.load(root, state.name, record.version)
            loaded[record.version] = metadata
        except (OSError, ValueError):  # a missing or unreadable version: listed, no metrics
            metadata = None
        gates = record.gates
        gates_text = "-" if gates is None else ("passed" if gates.passed else "[red]failed[/red]")
        if gates is not None and not gates.passed:
            gates_text += ": " + ", ".join(c.name for c in gates.failures())
        style = {"live": "green", "canary": "yellow", "shadow": "cyan"}.get(record.state.value)
        state_text = f"[{style}]{record.state.value}[/{style}]" if style else record.state.value
        table.add_row(
            record.version,
            state_text,
            state.traffic(record.version),
            _metric(metadata, "pr_auc"),
            _metric(metadata, "recall_at_1pct_fpr"),
            gates_text,
            f"{metadata.created_at:%Y-%m-%d %H:%M}" if metadata else "-",
        )
    console.print(table)
    console.print(f"routing: {_routing_text(state.routing)}")
    for record in records:
        console.print(
            f"  v{record.version} {record.state.value} since {record.since:%Y-%m-%d %H:%M:%S}: "
            f"{record.reason}"
        )
        source = _source_text(loaded.get(record.version))
        if source:
            console.print(f"      {source}", highlight=False)
        if record.gates is not None:
            for check in record.gates.checks:
                mark = "ok" if check.passed else "[red]FAILED[/red]"
                console.print(f"      gate {check.name} {mark}: {check.detail}")
    if history and state.history:
        console.print(f"[bold]last {min(history, len(state.history))} changes[/bold]")
        for t in state.history[-history:]:
            old = t.from_state.value if t.from_state else "new"
            console.print(
                f"  {t.at:%Y-%m-%d %H:%M:%S} g{t.generation} v{t.version} {old} → "
                f"{t.to_state.value} by {t.by}: {t.reason}"
            )


@app.command("list")
def list_command(
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
    history: Annotated[int, typer.Option(min=0, help="How many recent changes to show.")] = 10,
) -> None:
    """Versions, states, traffic shares, metrics, gates and the recent changes."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    try:
        state = lifecycle.read()
    except CorruptLifecycleFile as error:
        fail("list rejected", error.message, BAD_INPUT)
    if not state.versions:
        fail("list", f"no version of {name!r} is published in {lifecycle.model_root}", REFUSED)
    _print_list(state, lifecycle.model_root, history)


@app.command()
def shadow(
    version: VersionArgument,
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """Score live traffic with VERSION after each answer, for comparison only."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    _run("shadow", lambda: lifecycle.shadow(version))


@app.command()
def canary(
    version: VersionArgument,
    percent: Annotated[
        float,
        typer.Option(callback=_share, help="Share of cards VERSION answers, in % (0.01-100)."),
    ],
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """VERSION answers PERCENT % of the cards (the same cards throughout)."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    _run("canary", lambda: lifecycle.canary(version, percent))


@app.command()
def promote(
    version: VersionArgument,
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """VERSION answers all traffic at once; the current live version is kept for rollback."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    _run("promote", lambda: lifecycle.promote(version))


@app.command()
def rollback(
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
    reason: Annotated[str, typer.Option(help="Why, for the audit trail.")] = "",
) -> None:
    """The previous live version answers all traffic again, at once."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    _run("rollback", lambda: lifecycle.rollback(reason=reason))


@app.command()
def retire(
    version: VersionArgument,
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """Take VERSION out of service (candidate, shadow, canary or rollback target)."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    _run("retire", lambda: lifecycle.retire(version))
