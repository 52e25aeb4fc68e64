"""ONNX export of the selected model, the parity check against LightGBM, the version's metadata."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import lightgbm as lgb
import numpy as np
import onnx
import onnxmltools
import onnxruntime as ort
from onnxmltools.convert.common.data_types import FloatTensorType

from services.models import repository
from services.pipelines.training.params import TrainParams

INPUT_NAME = "input"
"""Name of the ONNX model's float32 [batch, n_features] input."""
OUTPUT_NAME = "probabilities"
"""Name of the ONNX probability output (onnxmltools, zipmap=False): [batch, 2]."""
PARITY_TOLERANCE = 1e-5
"""Largest accepted |LightGBM − ONNX Runtime| fraud probability on the test period."""


class ParityError(RuntimeError):
    """ONNX Runtime does not reproduce LightGBM closely enough to publish the model."""


def export_onnx(booster: lgb.Booster, n_features: int, path: Path) -> None:
    """Writes the model as ONNX (float32 input, probability output, no ZipMap) to ``path``."""
    model = onnxmltools.convert_lightgbm(
        booster,
        name=repository.DEFAULT_MODEL_NAME,
        initial_types=[(INPUT_NAME, FloatTensorType([None, n_features]))],
        zipmap=False,
    )
    outputs = [o.name for o in model.graph.output]
    if OUTPUT_NAME not in outputs:
        raise ParityError(f"ONNX export has outputs {outputs}, expected {OUTPUT_NAME!r}")
    _batch_is_dynamic(model)
    path.write_bytes(model.SerializeToString())


def _batch_is_dynamic(model: onnx.ModelProto) -> None:
    """Declares every output's first dimension as the batch: the converter declares the
    label output as one row, and ONNX Runtime then warns on every batch of more than one."""
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            dims[0].dim_param = "batch"


def parity_gap(onnx_path: Path, x: np.ndarray, expected: np.ndarray) -> float:
    """Largest |ONNX Runtime − LightGBM| fraud probability over the rows of ``x``."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    proba = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
    return float(np.max(np.abs(proba[:, 1].astype(np.float64) - expected)))


def metadata(
    thresholds: repository.Thresholds,
    defaults: dict[str, float],
    metrics: dict[str, float],
    window: repository.TrainingWindow,
    parity: float,
    params: TrainParams,
    created_at: datetime,
) -> repository.ModelMetadata:
    """The version's metadata before publishing gives it a number."""
    return repository.ModelMetadata(
        version="0",  # publishing assigns the real one
        feature_order=list(params.feature_order),
        input_name=INPUT_NAME,
        output_name=OUTPUT_NAME,
        thresholds=thresholds,
        default_features=defaults,
        metrics=metrics,
        training_window=window,
        parity_max_abs_diff=parity,
        created_at=created_at,
        lightgbm_version=lgb.__version__,
        onnxmltools_version=onnxmltools.__version__,
        onnxruntime_version=ort.__version__,
        params=params.record(),
    )
