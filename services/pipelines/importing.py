"""Bringing a model trained elsewhere: validate an ONNX model and its metadata, compute its
reference and gates on the store's latest periods, and publish it as a candidate.

The folder holds ``model.onnx`` and ``metadata.json`` (``ImportSpec``): the feature order (the
feature spec's default inputs in their order, then any servable features added to them, as
``fraudmesh train --feature`` writes it), the ONNX input and output names, the decision
thresholds and the default value of each feature; optionally a small model, ``small.onnx`` on the same
inputs and outputs, described by the spec's ``small_model``. Everything is checked before
anything is published: the files exist, the features are the spec's, the thresholds lie in
(0, 1) with review at or below decline, each model loads, takes float32 [batch, features] and
gives [batch, 2] probabilities, and answers a warm-up row of the defaults with probabilities
in [0, 1]. A problem raises ``ImportProblem`` naming the file and the field; nothing is
written then. A version folder that ``fraudmesh train`` published imports as it is: the spec
accepts every field the trainer writes (its version, window and parity are set again here),
and still refuses any other field, or a malformed one, by name.

A small model's clear-approve threshold is always chosen on the store's validation period by
the rule training uses (``small.clear_approve_threshold``), against the imported model's own
scores: the cascade's loss bound holds for the pair as served. Its own review and decline
thresholds are taken from the spec, or chosen on validation as training chooses them.

The version's reference is fitted on the validation period the store's data gives by the
training defaults (the same periods ``fraudmesh train`` would use), its quality measured on
the test period, and the promotion gates run against the live version on the test rows. An
imported model is its ONNX file: what is judged is what is served, so its parity figure is
zero by construction and the parity gate says so.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.domain import featurespec
from services.featurestore.settings import FeatureStoreSettings
from services.models import gates as promotion_gates
from services.models import reference, repository
from services.models.lifecycle import GateCheck, GateReport, ModelLifecycle
from services.models.onnx import OnnxModel, TensorSpec
from services.pipelines.training.frame import training_frame
from services.pipelines.training.params import TrainParams
from services.pipelines.training.periods import Periods
from services.pipelines.training.small import (
    SmallModelParams,
    clear_approve_threshold,
    own_thresholds,
)

SPEC_FILE = "metadata.json"
"""The metadata file of a folder to import."""
IMPORTED_BY = "fraudmesh model import"


class ImportProblem(ValueError):
    """The folder cannot be imported; the message names the file and the field."""


class ImportThresholds(BaseModel):
    """Decision thresholds of an imported model: strictly inside (0, 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    review: float
    decline: float


class ImportWindow(repository.TrainingWindow):
    """``training_window`` as ``fraudmesh train`` writes it; nothing else inside."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ImportSmallModel(BaseModel):
    """``small_model`` in ``metadata.json``: how the folder's ``small.onnx`` was made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["distilled", "labels"] = Field(
        description="distilled: trained on the full model's scores; labels: on the labels."
    )
    trees: int = Field(ge=1, description="Trees it holds.")
    num_leaves: int = Field(ge=2, description="Most leaves per tree.")
    max_depth: int = Field(ge=1, description="Deepest a tree may grow.")
    thresholds: ImportThresholds | None = Field(
        None,
        description="Its own review and decline thresholds, for when it answers alone; "
        "default: chosen on the validation period as training chooses them.",
    )
    # What ``fraudmesh train`` also writes about its small model: accepted so that a version
    # folder it published imports as it is, checked for shape, and chosen again here on this
    # store's validation period (the cascade's loss bound holds for the pair as served here).
    clear_approve: float | None = Field(
        None, ge=0.0, le=1.0, description="Its clear-approve threshold where it was trained."
    )
    max_fraud_loss: float | None = Field(
        None, ge=0.0, le=1.0, description="The loss budget it was chosen with there."
    )
    loss_confidence: float | None = Field(
        None, ge=0.0, le=1.0, description="The confidence of that loss bound there."
    )
    parity_max_abs_diff: float | None = Field(
        None, ge=0.0, description="Its LightGBM vs ONNX Runtime difference there."
    )
    candidates: list[dict[str, str | float]] = Field(
        default_factory=list, description="The small models compared there (kept as given)."
    )


class ImportSpec(BaseModel):
    """``metadata.json`` of a model trained elsewhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature_order: list[str] = Field(
        description="The default inputs in their order, then any servable features added."
    )
    input_name: str = Field("input", description="ONNX input: float32 [batch, features].")
    output_name: str = Field(
        "probabilities", description="ONNX output: float32 [batch, 2], column 1 = fraud."
    )
    thresholds: ImportThresholds
    default_features: dict[str, float] = Field(
        description="Value of each feature when it is missing (every feature)."
    )
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Figures the team measured (kept as given)."
    )
    params: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="How it was made (kept as given)."
    )
    small_model: ImportSmallModel | None = Field(
        None, description="The folder's small model (small.onnx); None: no cascade."
    )
    # The rest of what ``fraudmesh train`` writes in a published version's metadata.json, so
    # that its folder imports as published. The version, window and parity are this
    # repository's own and are set again on import; the library versions are kept.
    name: str | None = Field(None, description="The model's name where it was published.")
    version: str | None = Field(None, description="Its version there (a new one is assigned).")
    training_window: ImportWindow | None = Field(
        None, description="Its training window there (recomputed on this store's data)."
    )
    parity_max_abs_diff: float | None = Field(
        None, ge=0.0, description="Its LightGBM vs ONNX Runtime difference there."
    )
    created_at: datetime | None = Field(None, description="When it was trained (UTC).")
    lightgbm_version: str | None = Field(None, description="LightGBM that trained it.")
    onnxmltools_version: str | None = Field(None, description="onnxmltools that exported it.")
    onnxruntime_version: str | None = Field(None, description="ONNX Runtime it was checked on.")


@dataclass(frozen=True)
class Checked:
    """A folder that passed validation: its spec and the loaded model (and small model)."""

    spec: ImportSpec
    onnx_path: Path
    model: OnnxModel
    small_path: Path | None = None
    small: OnnxModel | None = None


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']}"


def validate(folder: Path) -> Checked:
    """The folder's spec and model, or ``ImportProblem`` with the first thing wrong."""
    if not folder.is_dir():
        raise ImportProblem(f"{folder} is not a folder")
    onnx_path = folder / repository.MODEL_FILE
    spec_path = folder / SPEC_FILE
    for path in (onnx_path, spec_path):
        if not path.is_file():
            raise ImportProblem(f"{path.name} is missing in {folder}")
    try:
        raw = json.loads(spec_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ImportProblem(f"{SPEC_FILE} is not JSON: {error}") from error
    try:
        spec = ImportSpec.model_validate(raw)
    except ValidationError as error:
        raise ImportProblem(f"{SPEC_FILE} {_problem(error)}") from error
    _check_features(spec)
    _check_thresholds(spec.thresholds)
    small_path = folder / repository.SMALL_MODEL_FILE
    if spec.small_model is not None:
        if not small_path.is_file():
            raise ImportProblem(
                f"{repository.SMALL_MODEL_FILE} is missing in {folder} "
                f"({SPEC_FILE} names a small_model)"
            )
        if spec.small_model.thresholds is not None:
            _check_thresholds(spec.small_model.thresholds, "small_model.thresholds")
    elif small_path.exists():
        raise ImportProblem(
            f"{repository.SMALL_MODEL_FILE} is in {folder} but {SPEC_FILE} has no small_model "
            "(its kind, trees, num_leaves and max_depth)"
        )
    metadata = _metadata(spec, datetime.now(UTC), None)
    model = _load(onnx_path, metadata, spec)
    if spec.small_model is None:
        return Checked(spec, onnx_path, model)
    return Checked(spec, onnx_path, model, small_path, _load(small_path, metadata, spec))


def _load(path: Path, metadata: repository.ModelMetadata, spec: ImportSpec) -> OnnxModel:
    """The ONNX file at ``path``, checked for loading, shapes and a warm-up row."""
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own classes for a file it cannot load
        raise ImportProblem(f"{path.name} does not load: {error}") from error
    _check_shapes(
        [TensorSpec.of(a) for a in session.get_inputs()],
        [TensorSpec.of(a) for a in session.get_outputs()],
        spec,
        path.name,
    )
    model = OnnxModel(metadata, path.parent, threads=1, model_file=path)
    _check_warm_up(model, path.name)
    return model


def _check_features(spec: ImportSpec) -> None:
    """The order is the default inputs in their order, then servable features added as
    ``fraudmesh train --feature`` adds them; every one of them has a finite default."""
    order, known = spec.feature_order, featurespec.MODEL_FEATURES
    unknown = [n for n in order if n not in featurespec.SERVABLE_FEATURES]
    if unknown:
        raise ImportProblem(
            f"{SPEC_FILE} feature_order: unknown feature {unknown[0]!r} (servable: the "
            f"{len(known)} default inputs, {', '.join(known[:4])}, …, then any of "
            f"{', '.join(featurespec.ADDABLE_FEATURES)})"
        )
    if tuple(order[: len(known)]) != known:
        missing = [n for n in known if n not in order]
        if missing:
            detail = f"lacks {missing[0]!r}"
        else:
            i = next(i for i, (a, b) in enumerate(zip(order, known, strict=False)) if a != b)
            detail = f"is not in the feature spec's order: {order[i]!r} where {known[i]!r} is"
        raise ImportProblem(
            f"{SPEC_FILE} feature_order {detail} (the default inputs in their order come "
            "first; added servable features follow them)"
        )
    try:
        featurespec.trained_order(order[len(known) :])
    except featurespec.FeatureChoiceError as error:
        raise ImportProblem(f"{SPEC_FILE} feature_order: {error}") from error
    extra = sorted(set(spec.default_features) - set(order))
    if extra:
        what = (
            "unknown feature" if extra[0] not in featurespec.SERVABLE_FEATURES else "not an input"
        )
        raise ImportProblem(f"{SPEC_FILE} default_features: {what} {extra[0]!r}")
    lacking = [n for n in order if n not in spec.default_features]
    if lacking:
        raise ImportProblem(f"{SPEC_FILE} default_features lacks {lacking[0]!r}")
    bad = [n for n, v in spec.default_features.items() if not math.isfinite(v)]
    if bad:
        raise ImportProblem(f"{SPEC_FILE} default_features.{bad[0]} is not a finite number")


def _check_thresholds(t: ImportThresholds, field: str = "thresholds") -> None:
    for name, value in (("review", t.review), ("decline", t.decline)):
        if not 0.0 < value < 1.0:  # False for NaN too
            raise ImportProblem(f"{SPEC_FILE} {field}.{name} is {value:g}, not inside (0, 1)")
    if t.decline < t.review:
        raise ImportProblem(
            f"{SPEC_FILE} {field}: decline {t.decline:g} is below review {t.review:g}"
        )


def _check_shapes(
    input_specs: list[TensorSpec],
    output_specs: list[TensorSpec],
    spec: ImportSpec,
    file: str = repository.MODEL_FILE,
) -> None:
    inputs = {i.name: i for i in input_specs}
    outputs = {o.name: o for o in output_specs}
    n = len(spec.feature_order)
    if spec.input_name not in inputs or len(inputs) != 1:
        raise ImportProblem(
            f"{SPEC_FILE} input_name {spec.input_name!r}: {file}'s inputs are "
            f"{sorted(inputs)} (one input is served)"
        )
    given = inputs[spec.input_name]
    if given.datatype != "FP32" or len(given.shape) != 2 or given.shape[1] not in (n, -1):
        raise ImportProblem(
            f"{file} input {spec.input_name!r} is {given.datatype} "
            f"{list(given.shape)}, not FP32 [batch, {n}]"
        )
    if spec.output_name not in outputs:
        raise ImportProblem(
            f"{SPEC_FILE} output_name {spec.output_name!r}: {file}'s outputs are {sorted(outputs)}"
        )
    out = outputs[spec.output_name]
    if out.datatype != "FP32" or len(out.shape) != 2 or out.shape[1] not in (2, -1):
        raise ImportProblem(
            f"{file} output {spec.output_name!r} is {out.datatype} "
            f"{list(out.shape)}, not FP32 [batch, 2]"
        )


def _check_warm_up(model: OnnxModel, file: str = repository.MODEL_FILE) -> None:
    row = np.array(
        [[model.metadata.default_features[f] for f in model.metadata.feature_order]] * 2,
        dtype=np.float32,
    )
    try:
        answer = model.run(row, [model.metadata.output_name])[0]
    except Exception as error:  # the runtime's own error classes
        raise ImportProblem(f"{file} fails on a warm-up row: {error}") from error
    answer = np.asarray(answer)
    if answer.shape != (2, 2):
        raise ImportProblem(
            f"{file} answers a 2-row batch with shape {list(answer.shape)}, not [2, 2]"
        )
    if not (np.isfinite(answer).all() and (answer >= 0).all() and (answer <= 1).all()):
        raise ImportProblem(f"{file} answers probabilities outside [0, 1]")


def _metadata(
    spec: ImportSpec, created_at: datetime, window: repository.TrainingWindow | None
) -> repository.ModelMetadata:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return repository.ModelMetadata(
        version="0",
        feature_order=list(spec.feature_order),
        input_name=spec.input_name,
        output_name=spec.output_name,
        thresholds=repository.Thresholds(
            review=spec.thresholds.review, decline=spec.thresholds.decline
        ),
        default_features=dict(spec.default_features),
        metrics=dict(spec.metrics),
        training_window=window
        or repository.TrainingWindow(start=epoch, end=epoch, holdout_start=epoch),
        parity_max_abs_diff=0.0,
        created_at=created_at,
        lightgbm_version=spec.lightgbm_version or "",
        onnxmltools_version=spec.onnxmltools_version or "",
        onnxruntime_version=ort.__version__,
        params={**spec.params, "imported": True},
    )


@dataclass(frozen=True)
class Imported:
    """What an import published."""

    metadata: repository.ModelMetadata
    folder: Path
    gates: GateReport
    reference: reference.ModelReference


def import_model(
    folder: Path,
    settings: FeatureStoreSettings,
    model_root: Path,
    policy: promotion_gates.GatePolicy | None = None,
    name: str = repository.DEFAULT_MODEL_NAME,
) -> Imported:
    """Validates ``folder``, fits its reference and gates on the store's data and publishes it
    as a candidate of ``name``; raises ``ImportProblem`` (nothing published) when invalid."""
    from services.pipelines.train import _split  # the periods training would use

    checked = validate(folder)
    params = TrainParams()
    order = tuple(checked.spec.feature_order)
    data = _split(training_frame(settings), params, Periods(), None, order)
    window = data.window
    assert window.validation_start is not None and window.train_end is not None
    model = checked.model
    test_x, test_y = data.x[data.test], data.y[data.test]
    test_scores = model.predict(test_x).astype(np.float64)
    thresholds = model.metadata.thresholds
    quality = reference.tested_quality(
        test_y, test_scores, thresholds, data.tested["card_id"].to_numpy(), params.seed
    )
    valid_x, valid_y = data.x[data.valid], data.y[data.valid]
    valid_scores = model.predict(valid_x).astype(np.float64)
    cascade = _cascade(
        checked, valid_x, valid_y, valid_scores, (test_x, test_y, test_scores), params
    )
    fitted = reference.fit(
        valid_scores,
        data.raw_valid,
        order,
        thresholds,
        (window.validation_start.isoformat(), window.train_end.isoformat()),
        quality,
        answered=cascade.answered if cascade else None,
    )
    fitted.notes.append(f"imported by {IMPORTED_BY}; scored by its own ONNX file")
    metadata = _metadata(checked.spec, datetime.now(UTC), window)
    ap = quality.average_precision.estimate
    metadata = metadata.model_copy(
        update={
            "metrics": {
                **metadata.metrics,
                **(cascade.metrics if cascade else {}),
                "pr_auc": ap,
                "holdout_rows": float(len(test_y)),
                "holdout_frauds": float(test_y.sum()),
            },
            "small_model": cascade.small_model if cascade else None,
        }
    )
    lifecycle = ModelLifecycle(model_root, name)
    # By name: the live version takes the default inputs, all of them in this order.
    holdout: Mapping[str, np.ndarray] = {f: test_x[:, j] for j, f in enumerate(order)}
    report = promotion_gates.evaluate(
        metadata, checked.onnx_path, holdout, test_y, model_root, policy,
        lifecycle.read().routing.live,
    )  # fmt: skip
    report = _imported_parity(report)
    with tempfile.TemporaryDirectory(prefix="fraudmesh-import-") as tmp:
        work = Path(tmp)
        fitted.write(work)
        (work / "metrics.json").write_text(json.dumps(metadata.metrics, indent=2, sort_keys=True))
        files = {
            repository.MODEL_FILE: checked.onnx_path,
            reference.REFERENCE_FILE: work / reference.REFERENCE_FILE,
            "metrics.json": work / "metrics.json",
            "imported-metadata.json": folder / SPEC_FILE,
        }
        if checked.small_path is not None:
            files[repository.SMALL_MODEL_FILE] = checked.small_path
        published, target, _ = lifecycle.publish_candidate(metadata, files, report, IMPORTED_BY)
    return Imported(published, target, report, fitted)


@dataclass(frozen=True)
class _Cascade:
    """An imported small model's metadata entry, the scores the cascade answers validation
    rows with (for the reference) and its figures for the version's metrics."""

    small_model: repository.SmallModel
    answered: np.ndarray
    metrics: dict[str, float]


def _cascade(
    checked: Checked,
    valid_x: np.ndarray,
    valid_y: np.ndarray,
    valid_scores: np.ndarray,
    test: tuple[np.ndarray, np.ndarray, np.ndarray],
    params: TrainParams,
) -> _Cascade | None:
    """The imported small model's thresholds, chosen on validation as training chooses them
    (the clear-approve threshold always, its own thresholds unless the spec gives them), and
    the cascade's first-stage share and lost review frauds on the test period (``test``: its
    inputs, labels and the imported model's scores)."""
    given = checked.spec.small_model
    if checked.small is None or given is None:
        return None
    rule = SmallModelParams()
    review = checked.spec.thresholds.review
    small_valid = checked.small.predict(valid_x).astype(np.float64)
    clear = clear_approve_threshold(
        small_valid, valid_scores, valid_y, review, rule.max_fraud_loss, rule.loss_confidence
    )
    own = (
        repository.Thresholds(review=given.thresholds.review, decline=given.thresholds.decline)
        if given.thresholds is not None
        else own_thresholds(small_valid[valid_y == 0], params)
    )
    test_x, test_y, test_scores = test
    small_test = checked.small.predict(test_x).astype(np.float64)
    flagged = (test_y == 1) & (test_scores >= review)
    entry = repository.SmallModel(
        kind=given.kind,
        trees=given.trees,
        num_leaves=given.num_leaves,
        max_depth=given.max_depth,
        clear_approve=clear,
        max_fraud_loss=rule.max_fraud_loss,
        loss_confidence=rule.loss_confidence,
        thresholds=own,
        parity_max_abs_diff=0.0,
    )
    answered = np.where(small_valid < clear, small_valid, valid_scores)
    figures = {
        "cascade_clear_approve": clear,
        "cascade_validation_first_stage_share": float((small_valid < clear).mean()),
        "cascade_first_stage_share": float((small_test < clear).mean()),
        "cascade_review_frauds_lost": float(((small_test < clear) & flagged).sum()),
        "cascade_review_frauds": float(flagged.sum()),
    }
    return _Cascade(entry, answered, figures)


def _imported_parity(report: GateReport) -> GateReport:
    """The parity check of an imported model: its ONNX file is what was judged and is served."""
    checks = [
        GateCheck(
            name="parity",
            passed=True,
            value=0.0,
            limit=c.limit,
            detail="imported ONNX model: the gates ran the file that is served",
        )
        if c.name == "parity"
        else c
        for c in report.checks
    ]
    return report.model_copy(update={"checks": checks, "passed": all(c.passed for c in checks)})
