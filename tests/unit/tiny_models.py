"""Tiny real models for lifecycle tests: LightGBM on synthetic rows, exported to ONNX.

Each trains in well under a second, has the project's feature order, input and output
names, so the repository, the gates, the scorer's registry and the gateway use them as
they use a trained fraud model.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import lightgbm as lgb
import numpy as np
import onnxmltools
from onnxmltools.convert.common.data_types import FloatTensorType

from services.domain.featurespec import MODEL_FEATURES
from services.models import repository
from services.models.lifecycle import GateReport, ModelLifecycle

N_FEATURES = len(MODEL_FEATURES)


def synthetic(n: int = 3000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose label depends on the first two features (about 10% positive)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] + 0.5 * rng.normal(size=n) > 1.6).astype(np.int32)
    return x, y


def holdout(seed: int = 2) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A holdout by feature name, and its labels."""
    x, y = synthetic(2000, seed)
    return {name: x[:, i] for i, name in enumerate(MODEL_FEATURES)}, y


def onnx_model(
    path: Path, trees: int = 20, shuffle_labels: bool = False, seed: int = 1, extra: int = 0
) -> Path:
    """Trains a small booster (on shuffled labels: a useless one) and writes it as ONNX;
    ``extra`` noise columns after the default inputs widen its input (added features)."""
    x, y = synthetic(seed=seed)
    if extra:
        noise = np.random.default_rng(seed).normal(size=(len(x), extra)).astype(np.float32)
        x = np.column_stack([x, noise])
    if shuffle_labels:
        y = np.random.default_rng(seed).permutation(y)
    params = {"objective": "binary", "verbose": -1, "num_threads": 1, "seed": seed}
    booster = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=trees)
    model = onnxmltools.convert_lightgbm(
        booster, initial_types=[("input", FloatTensorType([None, x.shape[1]]))], zipmap=False
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def metadata(**changes: object) -> repository.ModelMetadata:
    """Metadata of a tiny model; ``changes`` override fields."""
    fields: dict[str, object] = {
        "version": "0",
        "feature_order": list(MODEL_FEATURES),
        "input_name": "input",
        "output_name": "probabilities",
        "thresholds": repository.Thresholds(review=0.3, decline=0.8),
        "default_features": dict.fromkeys(MODEL_FEATURES, 0.0),
        "metrics": {"pr_auc": 0.5},
        "training_window": repository.TrainingWindow(
            start=datetime(2026, 1, 1, tzinfo=UTC),
            end=datetime(2026, 3, 1, tzinfo=UTC),
            holdout_start=datetime(2026, 2, 17, tzinfo=UTC),
        ),
        "parity_max_abs_diff": 1e-7,
        "created_at": datetime(2026, 3, 1, 12, tzinfo=UTC),
        "lightgbm_version": lgb.__version__,
        "onnxmltools_version": onnxmltools.__version__,
        "onnxruntime_version": "1",
    }
    fields.update(changes)
    return repository.ModelMetadata.model_validate(fields)


def publish(
    root: Path,
    model_file: Path,
    *,
    candidate: bool = True,
    gates: GateReport | None = None,
    **changes: object,
) -> str:
    """Publishes ``model_file``: as a candidate through the lifecycle, or the old way."""
    files = {repository.MODEL_FILE: model_file}
    if candidate:
        published, _, _ = ModelLifecycle(root).publish_candidate(metadata(**changes), files, gates)
        return published.version
    return repository.publish(root, metadata(**changes), files).name
