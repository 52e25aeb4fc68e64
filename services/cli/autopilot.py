"""``fraudmesh autopilot``: one decision of the retraining autopilot (a CronJob runs it on a
schedule): retrain from the decision log when the monitor advised it or the last run is old,
then hand a candidate whose gates passed to the monitor's staged rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from services.cli.exits import REFUSED, bad_option, fail
from services.common.errors import FailedPrecondition
from services.decisionlog.settings import DecisionLogSettings
from services.featurestore.settings import from_env
from services.models import repository
from services.models.rollout import DEFAULT_STEPS, check_steps

console = Console()
_STEPS_TEXT = ",".join(f"{share:g}" for share in DEFAULT_STEPS)


def autopilot_command(
    var_dir: Annotated[
        Path | None, typer.Option(help="State folder; default FRAUD_FEATURES_VAR_DIR or var.")
    ] = None,
    model_root: Annotated[
        Path | None, typer.Option(help="Folder of published models; default <var-dir>/models.")
    ] = None,
    decisions_root: Annotated[
        Path | None,
        typer.Option(
            help="The decision log; default FRAUD_DECISIONLOG_ROOT or <var-dir>/decisions."
        ),
    ] = None,
    advice_file: Annotated[
        Path | None,
        typer.Option(help="The monitor's advice; default <var-dir>/monitor/advice.jsonl."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Retrain now, advice or not.")] = False,
    max_age_days: Annotated[
        float, typer.Option(min=0.0, help="Retrain at least this often, advice or not.")
    ] = 7.0,
    steps: Annotated[
        str, typer.Option(help="Canary shares in %, comma-separated, ending at 100.")
    ] = _STEPS_TEXT,
    shadow_min_decisions: Annotated[int, typer.Option(min=0)] = 1000,
    step_min_decisions: Annotated[int, typer.Option(min=1)] = 1000,
    step_max_seconds: Annotated[float, typer.Option(min=1.0)] = 3600.0,
    require_approval: Annotated[
        bool, typer.Option(help="Wait for `fraudmesh model approve` before the last step.")
    ] = True,
) -> None:
    """Retrain from the decision log when it is due and roll the candidate out through the
    shadow gate and the canary steps; every decision is written into the version's history."""
    from services.pipelines import retraining
    from services.pipelines.autopilot import Autopilot, AutopilotPolicy, Trained

    try:
        shares = [float(part) for part in steps.split(",")]
    except ValueError:
        bad_option("--steps", f"{steps!r} is not a comma-separated list of percentages")
    problem = check_steps(shares)
    if problem is not None:
        bad_option("--steps", problem)
    settings = from_env(var_dir=var_dir)
    root = model_root or settings.var_dir / "models"
    log_root = decisions_root or DecisionLogSettings(var_dir=settings.var_dir).root_path
    advice = advice_file or settings.var_dir / "monitor" / "advice.jsonl"

    def train() -> Trained:
        result = retraining.train_from_decisions(settings, root, log_root)
        return Trained(result.training.metadata.version, result.training.gates)

    policy = AutopilotPolicy(
        max_age_days=max_age_days,
        steps=tuple(shares),
        shadow_min_decisions=shadow_min_decisions,
        step_min_decisions=step_min_decisions,
        step_max_seconds=step_max_seconds,
        require_approval=require_approval,
    )
    pilot = Autopilot(root, advice, train, policy, repository.DEFAULT_MODEL_NAME)
    try:
        run = pilot.run(force=force)
    except (FailedPrecondition, ValueError) as error:
        fail("autopilot failed", str(error), REFUSED)
    console.print(run.decision, highlight=False)
