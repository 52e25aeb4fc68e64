"""Bringing a model trained elsewhere: validate an ONNX model and its metadata, compute its
reference and gates on the store's latest periods, and publish it as a candidate.

The folder holds ``model.onnx`` and ``metadata.json`` (``ImportSpec``): the feature order (the
feature spec's, in its order), the ONNX input and output names, the decision thresholds and
the default value of each feature. Everything is checked before anything is published: the
files exist, the features are the spec's, the thresholds lie in (0, 1) with review at or
below decline, the model loads, takes float32 [batch, features] and gives [batch, 2]
probabilities, and answers a warm-up row of the defaults with probabilities in [0, 1]. A
problem raises ``ImportProblem`` naming the file and the field; nothing is written then.

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


class ImportSpec(BaseModel):
    """``metadata.json`` of a model trained elsewhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    feature_order: list[str] = Field(description="The feature spec's features, in its order.")
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


@dataclass(frozen=True)
class Checked:
    """A folder that passed validation: its spec and the loaded model."""

    spec: ImportSpec
    onnx_path: Path
    model: OnnxModel


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
    metadata = _metadata(spec, datetime.now(UTC), None)
    try:
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own classes for a file it cannot load
        raise ImportProblem(f"{repository.MODEL_FILE} does not load: {error}") from error
    _check_shapes(
        [TensorSpec.of(a) for a in session.get_inputs()],
        [TensorSpec.of(a) for a in session.get_outputs()],
        spec,
    )
    model = OnnxModel(metadata, folder, threads=1, model_file=onnx_path)
    _check_warm_up(model)
    return Checked(spec, onnx_path, model)


def _check_features(spec: ImportSpec) -> None:
    known = featurespec.MODEL_FEATURES
    unknown = [n for n in spec.feature_order if n not in known]
    if unknown:
        raise ImportProblem(
            f"{SPEC_FILE} feature_order: unknown feature {unknown[0]!r} "
            f"(the feature spec has {len(known)}: {', '.join(known[:4])}, …)"
        )
    if tuple(spec.feature_order) != tuple(known):
        missing = [n for n in known if n not in spec.feature_order]
        detail = f"lacks {missing[0]!r}" if missing else "is not in the feature spec's order"
        raise ImportProblem(f"{SPEC_FILE} feature_order {detail} (serving sends the spec's)")
    extra = sorted(set(spec.default_features) - set(known))
    if extra:
        raise ImportProblem(f"{SPEC_FILE} default_features: unknown feature {extra[0]!r}")
    lacking = [n for n in known if n not in spec.default_features]
    if lacking:
        raise ImportProblem(f"{SPEC_FILE} default_features lacks {lacking[0]!r}")
    bad = [n for n, v in spec.default_features.items() if not math.isfinite(v)]
    if bad:
        raise ImportProblem(f"{SPEC_FILE} default_features.{bad[0]} is not a finite number")


def _check_thresholds(t: ImportThresholds) -> None:
    for name, value in (("review", t.review), ("decline", t.decline)):
        if not 0.0 < value < 1.0:  # False for NaN too
            raise ImportProblem(f"{SPEC_FILE} thresholds.{name} is {value:g}, not inside (0, 1)")
    if t.decline < t.review:
        raise ImportProblem(
            f"{SPEC_FILE} thresholds: decline {t.decline:g} is below review {t.review:g}"
        )


def _check_shapes(
    input_specs: list[TensorSpec], output_specs: list[TensorSpec], spec: ImportSpec
) -> None:
    inputs = {i.name: i for i in input_specs}
    outputs = {o.name: o for o in output_specs}
    n = len(spec.feature_order)
    if spec.input_name not in inputs or len(inputs) != 1:
        raise ImportProblem(
            f"{SPEC_FILE} input_name {spec.input_name!r}: the model's inputs are "
            f"{sorted(inputs)} (one input is served)"
        )
    given = inputs[spec.input_name]
    if given.datatype != "FP32" or len(given.shape) != 2 or given.shape[1] not in (n, -1):
        raise ImportProblem(
            f"{repository.MODEL_FILE} input {spec.input_name!r} is {given.datatype} "
            f"{list(given.shape)}, not FP32 [batch, {n}]"
        )
    if spec.output_name not in outputs:
        raise ImportProblem(
            f"{SPEC_FILE} output_name {spec.output_name!r}: the model's outputs are "
            f"{sorted(outputs)}"
        )
    out = outputs[spec.output_name]
    if out.datatype != "FP32" or len(out.shape) != 2 or out.shape[1] not in (2, -1):
        raise ImportProblem(
            f"{repository.MODEL_FILE} output {spec.output_name!r} is {out.datatype} "
            f"{list(out.shape)}, not FP32 [batch, 2]"
        )


def _check_warm_up(model: OnnxModel) -> None:
    row = np.array(
        [[model.metadata.default_features[f] for f in model.metadata.feature_order]] * 2,
        dtype=np.float32,
    )
    try:
        answer = model.run(row, [model.metadata.output_name])[0]
    except Exception as error:  # the runtime's own error classes
        raise ImportProblem(f"{repository.MODEL_FILE} fails on a warm-up row: {error}") from error
    answer = np.asarray(answer)
    if answer.shape != (2, 2):
        raise ImportProblem(
            f"{repository.MODEL_FILE} answers a 2-row batch with shape {list(answer.shape)}, "
            "not [2, 2]"
        )
    if not (np.isfinite(answer).all() and (answer >= 0).all() and (answer <= 1).all()):
        raise ImportProblem(f"{repository.MODEL_FILE} answers probabilities outside [0, 1]")


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
        lightgbm_version="",
        onnxmltools_version="",
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
    data = _split(training_frame(settings), params, Periods(), None)
    window = data.window
    assert window.validation_start is not None and window.train_end is not None
    model = checked.model
    test_x, test_y = data.x[data.test], data.y[data.test]
    test_scores = model.predict(test_x).astype(np.float64)
    thresholds = model.metadata.thresholds
    quality = reference.tested_quality(
        test_y, test_scores, thresholds, data.tested["card_id"].to_numpy(), params.seed
    )
    fitted = reference.fit(
        model.predict(data.x[data.valid]).astype(np.float64),
        data.raw_valid,
        featurespec.MODEL_FEATURES,
        thresholds,
        (window.validation_start.isoformat(), window.train_end.isoformat()),
        quality,
    )
    fitted.notes.append(f"imported by {IMPORTED_BY}; scored by its own ONNX file")
    metadata = _metadata(checked.spec, datetime.now(UTC), window)
    ap = quality.average_precision.estimate
    metadata = metadata.model_copy(
        update={
            "metrics": {
                **metadata.metrics,
                "pr_auc": ap,
                "holdout_rows": float(len(test_y)),
                "holdout_frauds": float(test_y.sum()),
            }
        }
    )
    lifecycle = ModelLifecycle(model_root, name)
    holdout: Mapping[str, np.ndarray] = {
        f: test_x[:, j] for j, f in enumerate(featurespec.MODEL_FEATURES)
    }
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
        published, target, _ = lifecycle.publish_candidate(metadata, files, report, IMPORTED_BY)
    return Imported(published, target, report, fitted)


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
