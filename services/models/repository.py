"""The model repository: published model versions as folders of ONNX model plus metadata.

Layout: ``<model_root>/<name>/<version>/`` holds ``model.onnx``, ``metadata.json`` and
whatever else training wrote (metrics, curves). Versions are increasing integers. A
version folder appears complete or not at all: it is written under a temporary name and
renamed into place.

Names and versions come from clients too (the scorer's repository RPCs), and both become
path components: ``check_name`` and ``check_version`` accept only a plain name and a plain
version number, so ``..``, separators, absolute paths or NUL never reach the filesystem;
``load`` applies them before it looks at anything on disk.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.common.errors import InvalidArgument
from services.domain.validation import shown

DEFAULT_MODEL_NAME = "fraud-lgbm"
"""Name of the fraud model the services load unless told otherwise."""
MODEL_FILE = "model.onnx"
"""The ONNX model inside a version folder."""
METADATA_FILE = "metadata.json"
"""The ``ModelMetadata`` inside a version folder; written last, so it marks completeness."""
SMALL_MODEL_FILE = "small.onnx"
"""The version's small model inside its folder, when its metadata names one (``SmallModel``)."""


MAX_NAME_LENGTH = 128
"""Longest model name accepted: a folder name, far below any filesystem's limit."""
MAX_VERSION_DIGITS = 18
"""Most digits a version may have: every such number fits an int64, and no repository
publishes a quintillion versions."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_VERSION = re.compile(r"0|[1-9][0-9]*")


def name_problem(name: str) -> str | None:
    """What keeps ``name`` from being a model name (one plain folder name), or None."""
    if not name:
        return "is required"
    if len(name) > MAX_NAME_LENGTH:
        return f"is longer than {MAX_NAME_LENGTH} characters"
    if not (name.isascii() and _NAME.fullmatch(name)):
        return (
            f"{shown(name)} is not a model name: ASCII letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return None


def version_problem(version: str) -> str | None:
    """What keeps ``version`` from being a version number as published (digits, no sign,
    no leading zero), or None."""
    if not version:
        return "is required"
    if len(version) > MAX_VERSION_DIGITS:
        return f"is longer than {MAX_VERSION_DIGITS} digits"
    if not (version.isascii() and _VERSION.fullmatch(version)):
        return f"{shown(version)} is not a version number: digits only, as in '3'"
    return None


def check_name(field: str, name: str) -> None:
    """Raises InvalidArgument naming ``field`` unless ``name`` is a plain model name."""
    problem = name_problem(name)
    if problem is not None:
        raise InvalidArgument(field, problem)


def check_version(field: str, version: str) -> None:
    """Raises InvalidArgument naming ``field`` unless ``version`` is a plain version number."""
    problem = version_problem(version)
    if problem is not None:
        raise InvalidArgument(field, problem)


def _is_version_folder(entry_name: str) -> bool:
    # Folders are named str(int): "01" or a non-ASCII digit is not a version, just a folder.
    return version_problem(entry_name) is None


class ModelNotFoundError(FileNotFoundError):
    """No (such) model version is published; the message says how to get one."""


class Thresholds(BaseModel):
    """Decision thresholds on the fraud probability: review at or above, decline at or above."""

    model_config = ConfigDict(frozen=True)

    review: float = Field(ge=0.0, le=1.0, description="Score at or above which to review.")
    decline: float = Field(ge=0.0, le=1.0, description="Score at or above which to decline.")

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.decline < self.review:
            raise ValueError(f"decline {self.decline} is below review {self.review}")
        return self


class TrainingWindow(BaseModel):
    """The data a version was trained and evaluated on (UTC)."""

    model_config = ConfigDict(frozen=True)

    start: datetime = Field(description="First transaction time used for training.")
    end: datetime = Field(description="End of the data (exclusive).")
    holdout_start: datetime = Field(description="Start of the held-out evaluation period.")
    train_end: datetime | None = Field(
        default=None,
        description="End of the training window (exclusive); the validation period ends here.",
    )
    validation_start: datetime | None = Field(
        default=None,
        description="Start of the validation period carved from the end of the training "
        "window (model selection and thresholds).",
    )


class SmallModel(BaseModel):
    """A version's small model (``SMALL_MODEL_FILE``): few shallow trees on the same inputs,
    run inside the gateway as the cascade's first stage and as the first fallback when the
    full model cannot answer. How it is made and its thresholds chosen: docs/cascade.md."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["distilled", "labels"] = Field(
        description="distilled: trained on the full model's scores; labels: on the labels."
    )
    trees: int = Field(ge=1, description="Trees it holds.")
    num_leaves: int = Field(ge=2, description="Most leaves per tree.")
    max_depth: int = Field(ge=1, description="Deepest a tree may grow.")
    clear_approve: float = Field(
        ge=0.0,
        le=1.0,
        description="Below this score the cascade approves without asking the full model; "
        "chosen on the validation period so that the cascade loses at most "
        "``max_fraud_loss`` of the frauds the full model flags at review on fresh payments "
        "with probability ``loss_confidence``, and never above the full model's review "
        "threshold.",
    )
    max_fraud_loss: float = Field(
        ge=0.0, le=1.0, description="The share of the full model's review frauds it may lose."
    )
    loss_confidence: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Probability that the loss stays within ``max_fraud_loss`` out of sample "
        "(absent in versions whose threshold allowed the budget's own count on validation).",
    )
    thresholds: Thresholds = Field(
        description="Its own review and decline thresholds, for when it answers alone."
    )
    parity_max_abs_diff: float = Field(
        description="Largest |LightGBM − ONNX Runtime| fraud probability on the holdout."
    )
    candidates: list[dict[str, str | float]] = Field(
        default_factory=list,
        description="Each candidate (distilled, labels) and its figures on validation.",
    )


class ModelMetadata(BaseModel):
    """Everything a service needs to use a model version, and how it was made."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(default=DEFAULT_MODEL_NAME, description="Model name.")
    version: str = Field(description="Increasing integer as a string; assigned by publish().")
    feature_order: list[str] = Field(description="Input columns in order (MODEL_FEATURES).")
    input_name: str = Field(description="ONNX input: float32 [batch, len(feature_order)].")
    output_name: str = Field(
        description="ONNX probability output: float32 [batch, 2], column 1 = fraud."
    )
    thresholds: Thresholds
    default_features: dict[str, float] = Field(
        description="Value of each feature when it is missing: the training population median."
    )
    metrics: dict[str, float] = Field(description="Holdout metrics (PR-AUC, ROC-AUC, …).")
    training_window: TrainingWindow
    parity_max_abs_diff: float = Field(
        description="Largest |LightGBM − ONNX Runtime| fraud probability on the holdout."
    )
    created_at: datetime = Field(description="When the version was trained (UTC).")
    lightgbm_version: str
    onnxmltools_version: str
    onnxruntime_version: str
    params: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Training parameters (seed, trees, …)."
    )
    small_model: SmallModel | None = Field(
        default=None,
        description="The version's small model (``SMALL_MODEL_FILE``); None: the version has "
        "none, so it runs without a cascade and the rules are its only fallback.",
    )

    @model_validator(mode="after")
    def _complete_defaults(self) -> ModelMetadata:
        missing = [n for n in self.feature_order if n not in self.default_features]
        if missing:
            raise ValueError(f"default_features lacks {missing}")
        return self


def _versions(model_root: Path, name: str) -> list[int]:
    check_name("name", name)
    folder = model_root / name
    if not folder.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in folder.iterdir()
        if _is_version_folder(entry.name) and (entry / METADATA_FILE).is_file()
    )


def published_versions(model_root: Path, name: str = DEFAULT_MODEL_NAME) -> list[str]:
    """Every complete published version of ``name``, in increasing order."""
    return [str(v) for v in _versions(model_root, name)]


def latest_version(model_root: Path, name: str = DEFAULT_MODEL_NAME) -> str | None:
    """The highest published version of ``name``, or None when there is none."""
    versions = _versions(model_root, name)
    return str(versions[-1]) if versions else None


def load(
    model_root: Path, name: str = DEFAULT_MODEL_NAME, version: str | None = None
) -> tuple[ModelMetadata, Path]:
    """Metadata and folder of ``version`` (default: the latest) of model ``name``; a name or
    version that is not plain raises InvalidArgument before anything is looked up."""
    check_name("name", name)
    if version is not None:
        check_version("version", version)
    if version is None:
        version = latest_version(model_root, name)
        if version is None:
            raise ModelNotFoundError(
                f"no model {name!r} is published under {model_root}: run `fraudmesh train`"
            )
    folder = model_root / name / version
    if not (folder / METADATA_FILE).is_file() or not (folder / MODEL_FILE).is_file():
        published = ", ".join(map(str, _versions(model_root, name))) or "none"
        raise ModelNotFoundError(
            f"version {version!r} of model {name!r} is not published under {model_root} "
            f"(published: {published}); run `fraudmesh train` or pick another version"
        )
    metadata = ModelMetadata.model_validate_json((folder / METADATA_FILE).read_text())
    return metadata, folder


def publish(model_root: Path, metadata: ModelMetadata, files: Mapping[str, Path]) -> Path:
    """Publishes ``files`` (name in the folder → source path, ``model.onnx`` among them)
    with ``metadata`` as the next version of ``metadata.name``; returns the version folder.

    ``metadata.version`` is replaced by the version assigned here. Concurrent publishers
    each get their own version: the rename into place fails for all but one of them.
    """
    if MODEL_FILE not in files:
        raise ValueError(f"a model version needs {MODEL_FILE}")
    if metadata.small_model is not None and SMALL_MODEL_FILE not in files:
        raise ValueError(f"the metadata names a small model but {SMALL_MODEL_FILE} is missing")
    check_name("name", metadata.name)
    parent = model_root / metadata.name
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".publishing-", dir=parent))
    try:
        for filename, source in files.items():
            shutil.copyfile(source, staging / filename)
        while True:
            # Numbered after every folder, complete or not, so a stray one is skipped.
            taken = [int(e.name) for e in parent.iterdir() if _is_version_folder(e.name)]
            version = str(max(taken, default=0) + 1)
            final = metadata.model_copy(update={"version": version})
            (staging / METADATA_FILE).write_text(final.model_dump_json(indent=2))
            target = parent / version
            try:
                # rename(2) fails when the target exists (non-empty); another publisher
                # took this number, so take the next one.
                os.rename(staging, target)
            except OSError:
                if not target.exists():
                    raise
                continue
            return target
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
