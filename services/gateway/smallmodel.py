"""A version's small model, run by ONNX Runtime inside the gateway (the cascade's first stage
and the first fallback, ``pipeline.py``).

The small model is a few shallow trees (``SMALL_MODEL_FILE`` in the version folder, its
thresholds in the version's metadata): one run is a few microseconds of ONNX Runtime, cheaper
inline on the event loop than any hop, and it is there when the scorer is not. Whatever the
transport to the scorer, the gateway loads each routed version's small model itself.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np

from services.models import repository
from services.models.onnx import OnnxModel
from services.models.repository import ModelMetadata

log = logging.getLogger(__name__)


class LocalSmallModel:
    """A loaded small model: one row in, its fraud probability out, synchronously."""

    def __init__(self, model: OnnxModel) -> None:
        self._run = model.session.run
        self._outputs = [model.metadata.output_name]
        self._row = np.empty((1, model.n_features), dtype=np.float32)
        self._feed = {model.metadata.input_name: self._row}

    def score(self, vector: list[float]) -> float:
        """Fraud probability of one model feature vector."""
        self._row[0] = vector
        return float(self._run(self._outputs, self._feed)[0][0, 1])


class LocalSmallModelProvider:
    """Loads versions' small models into this process (off the event loop) and warms them."""

    def __init__(self, model_root: Path, warmup_calls: int = 50) -> None:
        self._model_root = model_root
        self._warmup_calls = warmup_calls

    def _load(self, metadata: ModelMetadata) -> LocalSmallModel:
        folder = self._model_root / metadata.name / metadata.version
        model = OnnxModel(metadata, folder, 1, model_file=folder / repository.SMALL_MODEL_FILE)
        model.warm_up(self._warmup_calls)
        return LocalSmallModel(model)

    async def prepare(self, metadata: ModelMetadata) -> LocalSmallModel | None:
        """The version's small model, loaded and warmed; None when it has none or it cannot be
        loaded (logged: the version then answers without a cascade, the rules as its fallback)."""
        if metadata.small_model is None:
            return None
        # The version folder's name is the plain version: checked before it becomes a path.
        repository.check_name("name", metadata.name)
        repository.check_version("version", metadata.version)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self._load, metadata)
        except Exception:
            log.exception(
                "cannot load the version's small model; it runs without a cascade",
                extra={"version": metadata.version},
            )
            return None
