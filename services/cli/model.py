"""``fraudmesh model …``: list model versions and move them through their lifecycle.

Each command changes the lifecycle file beside the models (``routing.json``); every
gateway and scorer follows it within a fraction of a second, without a restart. Commands
print what changed. Exit status 1: the lifecycle does not allow the change (a refusal of a
valid request, with the reason); 2: bad input (an unknown version, a percent outside
0.01-100, a model name that is not a plain name, a corrupt ``routing.json``). Either way one
line on stderr says why and nothing was changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from services.cli.exits import BAD_INPUT, REFUSED, bad_option, fail
from services.common.errors import FraudmeshError, InvalidArgument, NotFound
from services.domain.canary import CanaryPolicy
from services.featurestore.settings import from_env
from services.models import repository
from services.models.lifecycle import (
    CorruptLifecycleFile,
    LifecycleChange,
    LifecycleState,
    ModelLifecycle,
    Routing,
    VersionState,
    default_actor,
)
from services.models.rollout import (
    DEFAULT_STEPS,
    Phase,
    RolloutEnd,
    RolloutFile,
    RolloutPlan,
    check_steps,
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
    _print_rollout(RolloutFile(root, state.name).read())
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


def _print_rollout(plan: RolloutPlan | None) -> None:
    if plan is None:
        return
    console.print(f"[bold]rollout[/bold] of v{plan.version}: {plan.where()}", highlight=False)
    for result in plan.results:
        mark = "passed" if result.passed else "[red]FAILED[/red]"
        console.print(
            f"  {result.at:%H:%M:%S} {result.step} {mark} on {result.decisions} decisions "
            f"(live {result.live_decisions}, {result.seconds:g} s)",
            highlight=False,
        )
        for c in result.comparisons:
            console.print(
                f"      {'ok' if c.passed else '[red]FAIL[/red]'} {c.name}: {c.detail}",
                highlight=False,
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
    min_decisions: Annotated[
        int,
        typer.Option(
            min=0,
            help="Hand VERSION to the monitor's shadow gate, judged once it has scored this "
            "many answers (agreement, score PSI, answers scored in time); 0: shadow only.",
        ),
    ] = 0,
    max_seconds: Annotated[
        float, typer.Option(min=1.0, help="The gate fails when the decisions take longer.")
    ] = 3600.0,
    wait: Annotated[bool, typer.Option(help="With --min-decisions: wait for the verdict.")] = False,
) -> None:
    """Score live traffic with VERSION after each answer, for comparison only; with
    --min-decisions, the monitor judges it and records the verdict in the history."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    if min_decisions == 0:
        _run("shadow", lambda: lifecycle.shadow(version))
        return
    plan = _new_plan(
        lifecycle,
        version,
        steps=[],
        shadow_min_decisions=min_decisions,
        step_min_decisions=1,
        step_max_seconds=max_seconds,
        require_approval=True,
        stop_after_shadow=True,
    )
    _start_plan(lifecycle, plan, "shadow")
    if wait:
        _wait(lifecycle, max_seconds + 60)


def _new_plan(lifecycle: ModelLifecycle, version: str, **fields: Any) -> RolloutPlan:
    phase = Phase.SHADOW if fields["shadow_min_decisions"] else Phase.CANARY
    return RolloutPlan(
        version=version,
        requested_by=default_actor(),
        requested_at=datetime.now(UTC),
        phase=phase,
        **fields,
    )


def _start_plan(lifecycle: ModelLifecycle, plan: RolloutPlan, action: str) -> None:
    """Checks the version may be rolled out and writes the plan for the monitor."""
    plans = RolloutFile(lifecycle.model_root, lifecycle.name)
    try:
        with plans.locked():
            state = lifecycle.read()
            record = state.record(plan.version)
            current = plans.read()
            if current is not None and not current.finished:
                fail(
                    f"{action} refused",
                    f"v{current.version} is being rolled out ({current.where()}): let it "
                    "finish, or retire it",
                    REFUSED,
                )
            if record.state in (VersionState.LIVE, VersionState.RETIRED):
                fail(f"{action} refused", f"v{plan.version} is {record.state.value}", REFUSED)
            if state.routing.live is None:
                fail(f"{action} refused", "no live version to compare with", REFUSED)
            gates = record.gates
            if gates is not None and not gates.passed:
                failed = "; ".join(f"{c.name}: {c.detail}" for c in gates.failures())
                fail(f"{action} refused", f"v{plan.version} failed its gates ({failed})", REFUSED)
            plans.write(plan)
    except (InvalidArgument, NotFound, CorruptLifecycleFile) as error:
        fail(f"{action} rejected", error.message, BAD_INPUT)
    console.print(f"v{plan.version}: handed to the monitor's rollout controller: {plan.where()}")
    if plan.steps:
        console.print(
            f"  steps {', '.join(f'{s:g}%' for s in plan.steps)}; each judged on at least "
            f"{plan.step_min_decisions} decisions of each arm within {plan.step_max_seconds:g} s"
        )
    console.print("  follow it with `fraudmesh model list`")


def _wait(lifecycle: ModelLifecycle, timeout_s: float) -> None:
    """Waits for the rollout to end; exit 0 when it promoted or passed, 1 otherwise."""
    plans = RolloutFile(lifecycle.model_root, lifecycle.name)
    deadline = time.monotonic() + timeout_s
    plan = plans.read()
    while plan is not None and not plan.finished and time.monotonic() < deadline:
        time.sleep(1.0)
        plan = plans.read()
    if plan is None or not plan.finished:
        fail("rollout", "no verdict yet: is the monitor running?", REFUSED)
    for result in plan.results:
        mark = "passed" if result.passed else "[red]FAILED[/red]"
        console.print(f"  {result.step} {mark}: {result.summary()}", highlight=False)
    console.print(f"v{plan.version}: {plan.where()}", highlight=False)
    if plan.outcome not in (RolloutEnd.PROMOTED, RolloutEnd.SHADOW_PASSED):
        raise typer.Exit(REFUSED)


def _steps(text: str) -> list[float]:
    """Typer callback: comma-separated canary shares ending at 100."""
    try:
        steps = [float(part) for part in text.split(",")]
    except ValueError:
        bad_option("--steps", f"{text!r} is not a comma-separated list of percentages")
    problem = check_steps(steps)
    if problem is not None:
        bad_option("--steps", problem)
    return steps


def _policy(pairs: list[str]) -> dict[str, float]:
    """``--policy NAME=VALUE`` pairs: canary policy fields checked against the policy."""
    overrides: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        try:
            if not sep:
                raise ValueError(f"{pair!r} is not NAME=VALUE")
            overrides[name.strip()] = float(text)
        except ValueError as error:
            bad_option("--policy", str(error))
    try:
        CanaryPolicy().with_overrides(overrides)
    except ValueError as error:
        bad_option("--policy", str(error))
    return overrides


@app.command()
def rollout(
    version: VersionArgument,
    steps: Annotated[
        str, typer.Option(help="Canary shares in %, comma-separated; the last (100) promotes.")
    ] = ",".join(f"{s:g}" for s in DEFAULT_STEPS),
    shadow_min_decisions: Annotated[
        int, typer.Option(min=0, help="Decisions of the shadow gate first; 0: no shadow gate.")
    ] = 1000,
    step_min_decisions: Annotated[
        int, typer.Option(min=1, help="Decisions each arm needs before a step is judged.")
    ] = 1000,
    step_max_seconds: Annotated[
        float,
        typer.Option(min=1.0, help="A step without enough decisions by then rolls back."),
    ] = 3600.0,
    require_approval: Annotated[
        bool, typer.Option(help="Wait for `fraudmesh model approve` before the last step.")
    ] = False,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=VALUE: a canary policy field (services/domain/canary.py) this rollout "
            "is judged by instead of the monitor's FRAUD_CANARY_* settings; repeatable.",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait until the rollout ends.")] = False,
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """Hand VERSION to the monitor's rollout controller: a shadow gate, then each canary
    share judged against live on the same window, rolled back at the first failed step,
    promoted (or held for approval) after the last."""
    overrides = _policy(policy or [])
    lifecycle = _lifecycle(var_dir, model_root, name)
    plan = _new_plan(
        lifecycle,
        version,
        steps=_steps(steps),
        shadow_min_decisions=shadow_min_decisions,
        step_min_decisions=step_min_decisions,
        step_max_seconds=step_max_seconds,
        require_approval=require_approval,
        policy=overrides,
    )
    _start_plan(lifecycle, plan, "rollout")
    if wait:
        _wait(lifecycle, step_max_seconds * (len(plan.steps) + 1) + 60)


@app.command()
def approve(
    version: VersionArgument,
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """Promote VERSION whose staged rollout passed every step and waits for approval."""
    lifecycle = _lifecycle(var_dir, model_root, name)
    plans = RolloutFile(lifecycle.model_root, lifecycle.name)
    with plans.locked():
        try:
            plan = plans.read()
        except CorruptLifecycleFile as error:
            fail("approve rejected", error.message, BAD_INPUT)
        if plan is None or plan.version != version or plan.phase is not Phase.APPROVAL:
            where = f"v{plan.version}: {plan.where()}" if plan else "no rollout"
            fail("approve refused", f"v{version} is not waiting for approval ({where})", REFUSED)
        reason = f"approved by {default_actor()} after {len(plan.results)} judged steps"
        _run("approve", lambda: lifecycle.promote(version, reason=reason))
        plan.phase, plan.outcome, plan.reason = Phase.DONE, RolloutEnd.PROMOTED, reason
        plan.finished_at = datetime.now(UTC)
        plans.write(plan)


@app.command("import")
def import_command(
    folder: Annotated[
        Path,
        typer.Argument(
            help="Folder with model.onnx and metadata.json (and optionally small.onnx).",
            show_default=False,
        ),
    ],
    var_dir: VarDirOption = None,
    model_root: ModelRootOption = None,
    name: NameOption = repository.DEFAULT_MODEL_NAME,
) -> None:
    """Publish a model trained elsewhere as a candidate: validated, given a reference on the
    store's latest periods, judged by the promotion gates against live."""
    from services.pipelines import importing
    from services.pipelines.training.params import TrainingDataError

    settings = from_env(var_dir=var_dir)
    root = model_root or settings.var_dir / "models"
    try:
        importing.validate(folder)
    except importing.ImportProblem as error:
        fail("import rejected", str(error), BAD_INPUT)
    try:
        done = importing.import_model(folder, settings, root, name=name)
    except importing.ImportProblem as error:
        fail("import rejected", str(error), BAD_INPUT)
    except (TrainingDataError, FraudmeshError, FileNotFoundError) as error:
        fail("import failed", str(error), REFUSED)
    m = done.metadata
    console.print(f"v{m.version}: new → [bold]candidate[/bold] (imported from {folder})")
    q = done.reference.quality
    if q is not None:
        console.print(
            f"  test period: average precision {q.average_precision.estimate:.4f}, recall at "
            f"review {q.recall['review'].estimate:.1%}, at decline {q.recall['decline'].estimate:.1%}"
            f" ({q.frauds} frauds in {q.rows} payments)",
            highlight=False,
        )
    small = m.small_model
    if small is not None:
        console.print(
            f"  small model ({small.kind}): clear-approve below {small.clear_approve:.4g} "
            f"(first stage {m.metrics['cascade_first_stage_share']:.1%} of the test period, "
            f"{m.metrics['cascade_review_frauds_lost']:.0f} of "
            f"{m.metrics['cascade_review_frauds']:.0f} review frauds lost); alone it reviews at "
            f"{small.thresholds.review:.4g} and declines at {small.thresholds.decline:.4g}",
            highlight=False,
        )
    against = f"v{done.gates.against}" if done.gates.against else "no live version"
    verdict = "passed" if done.gates.passed else "[red]failed[/red]"
    console.print(f"  gates against {against}: {verdict}")
    for check in done.gates.checks:
        console.print(f"    {check.name}: {check.detail}", highlight=False)


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
