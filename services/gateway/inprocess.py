"""In-process dependencies: the gateway reads the online store and runs the model itself.

With ``FRAUD_GATEWAY_IN_PROCESS=true`` the gateway keeps its pipeline, budget, breakers and
fallbacks but replaces its two gRPC clients with these: ``LocalFeatureClient`` reads the
Feast online store through the feature service's reader (``OnlineFeatureReader``, the
same keys, freshness rules and parity-tested read path), and ``LocalModelClient`` runs the
published ONNX model with ONNX Runtime. Each Score then costs one gRPC server call instead
of one server call plus two client calls and two more server calls, which on a small
machine is most of the CPU a Score takes (docs/performance.md). The feature service and the
scorer stay what other clients call.

Both calls run inline on the event loop: a read is one Redis round trip (or a SQLite
lookup) of about 0.15 ms of CPU and a model run about 15 µs, cheaper than a hop to a thread.
The Redis socket timeout is capped at the feature call's budget slice, so a hung Redis
costs at most that slice before the breaker takes over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from services.common.errors import Unavailable
from services.domain import featurespec
from services.domain.featurespec import FeatureStatus
from services.featurestore.online import OnlineFeatureReader
from services.gateway.ports import DependencyError
from services.models.onnx import OnnxModel
from services.models.repository import ModelMetadata


class LocalFeatureClient:
    """Store features from the online store, read in this process."""

    def __init__(self, reader: OnlineFeatureReader) -> None:
        self._reader = reader
        self._names = featurespec.STORE_FEATURES

    async def get(
        self,
        card_id: str,
        merchant_id: str,
        as_of_s: float,
        timeout_s: float,
        terminal_id: str = "",
    ) -> Mapping[str, float | None]:
        """Fresh values by name; None for missing or stale ones."""
        try:
            rows = self._reader.read(card_id, merchant_id, as_of_s, terminal_id)
        except Unavailable as error:
            raise DependencyError("features", "unavailable", error.message) from error
        return {
            name: value if status == FeatureStatus.PRESENT else None
            for name, (value, status, _) in zip(self._names, rows, strict=True)
        }

    def close(self) -> None:
        """Closes the online store connection."""
        self._reader.close()


class LocalModelProvider:
    """Loads versions into this process with ONNX Runtime (off the event loop)."""

    def __init__(self, model_root: Path, threads: int = 1, warmup_calls: int = 50) -> None:
        self._model_root = model_root
        self._threads = threads
        self._warmup_calls = warmup_calls

    def _load(self, metadata: ModelMetadata) -> OnnxModel:
        model = OnnxModel.load(self._model_root, metadata.name, metadata.version, self._threads)
        model.warm_up(self._warmup_calls)
        return model

    async def prepare(self, metadata: ModelMetadata, load: bool = True) -> LocalModelClient:
        """A client running ``metadata``'s version here, loaded and warmed."""
        loop = asyncio.get_running_loop()
        return LocalModelClient(await loop.run_in_executor(None, self._load, metadata))


class LocalModelClient:
    """Fraud probabilities from the ONNX model, run in this process."""

    def __init__(self, model: OnnxModel) -> None:
        self._model = model
        self._row = np.empty((1, model.n_features), dtype=np.float32)

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability of one row."""
        self._row[0] = vector
        return float(self._model.predict(self._row)[0])

    async def score_batch(self, vectors: list[list[float]], timeout_s: float) -> list[float]:
        """Fraud probabilities of several rows, in one run."""
        return [float(p) for p in self._model.predict(np.asarray(vectors, dtype=np.float32))]
