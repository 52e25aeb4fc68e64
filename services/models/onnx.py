"""A published model version run by ONNX Runtime: load once, then predict fraud probabilities."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from services.common.errors import FailedPrecondition
from services.models import repository


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, v2 datatype and shape of one model tensor (-1 marks the batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, arg: ort.NodeArg) -> TensorSpec:
        """The spec of an ONNX Runtime session's input or output."""
        return _spec(arg)


_V2_TYPES = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(string)": "BYTES",
}


def _spec(arg: ort.NodeArg) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorSpec(arg.name, _V2_TYPES.get(arg.type, arg.type), shape)


class OnnxModel:
    """A published model version served by ONNX Runtime."""

    def __init__(
        self,
        metadata: repository.ModelMetadata,
        folder: Path,
        threads: int = 1,
        model_file: Path | None = None,
    ) -> None:
        self.metadata = metadata
        self.folder = folder
        path = model_file or folder / repository.MODEL_FILE
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [_spec(a) for a in self.session.get_inputs()]
        self.outputs = [_spec(a) for a in self.session.get_outputs()]
        self.n_features = len(metadata.feature_order)
        self._input_name = metadata.input_name
        if metadata.output_name not in [o.name for o in self.outputs]:
            raise ValueError(f"{path} has no output {metadata.output_name!r}")
        # Only the probabilities: the label output is neither needed nor computed.
        self._proba_output = [metadata.output_name]

    @classmethod
    def load(
        cls, model_root: Path, name: str, version: str | None = None, threads: int = 1
    ) -> OnnxModel:
        """Loads the given version (default: the latest published) of model ``name``."""
        try:
            metadata, folder = repository.load(model_root, name, version)
        except FileNotFoundError as error:
            raise FailedPrecondition(str(error)) from error
        return cls(metadata, folder, threads)

    @property
    def name(self) -> str:
        """The model name."""
        return self.metadata.name

    @property
    def version(self) -> str:
        """The model version."""
        return self.metadata.version

    def run(self, batch: np.ndarray, outputs: list[str] | None = None) -> list[np.ndarray]:
        """Runs the session on a float32 [n, n_features] batch; returns the named outputs."""
        return self.session.run(outputs, {self._input_name: batch})

    def predict(self, batch: np.ndarray) -> np.ndarray:
        """Fraud probability for each row of a float32 [n, n_features] batch."""
        proba = self.session.run(self._proba_output, {self._input_name: batch})[0]
        return proba[:, 1]

    def warm_up(self, calls: int) -> None:
        """Runs ``calls`` single-row inferences on the default features."""
        row = np.array(
            [[self.metadata.default_features[n] for n in self.metadata.feature_order]],
            dtype=np.float32,
        )
        for _ in range(calls):
            self.predict(row)
