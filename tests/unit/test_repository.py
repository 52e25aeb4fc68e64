"""The model repository: versions, atomic publishing, loading and its errors."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.errors import InvalidArgument
from services.domain.featurespec import MODEL_FEATURES
from services.models import repository

from .path_like import PATH_LIKE_NAMES, PATH_LIKE_VERSIONS


def metadata(**changes: object) -> repository.ModelMetadata:
    fields: dict[str, object] = {
        "version": "0",
        "feature_order": list(MODEL_FEATURES),
        "input_name": "input",
        "output_name": "probabilities",
        "thresholds": repository.Thresholds(review=0.1, decline=0.8),
        "default_features": dict.fromkeys(MODEL_FEATURES, 0.0),
        "metrics": {"pr_auc": 0.7},
        "training_window": repository.TrainingWindow(
            start=datetime(2026, 1, 1, tzinfo=UTC),
            end=datetime(2026, 3, 1, tzinfo=UTC),
            holdout_start=datetime(2026, 2, 17, tzinfo=UTC),
        ),
        "parity_max_abs_diff": 1e-7,
        "created_at": datetime(2026, 3, 1, 12, tzinfo=UTC),
        "lightgbm_version": "4.7.0",
        "onnxmltools_version": "1.16.0",
        "onnxruntime_version": "1.31.1",
    }
    fields.update(changes)
    return repository.ModelMetadata.model_validate(fields)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "staged.onnx"
    path.write_bytes(b"not really onnx")
    return path


def test_nothing_published_says_how_to_train(tmp_path: Path) -> None:
    assert repository.latest_version(tmp_path / "models") is None
    with pytest.raises(repository.ModelNotFoundError, match="fraudmesh train"):
        repository.load(tmp_path / "models")
    # Callers that only know FileNotFoundError still catch it.
    with pytest.raises(FileNotFoundError):
        repository.load(tmp_path / "models", "fraud-lgbm")


def test_publish_assigns_increasing_versions(tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "models"
    first = repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
    second = repository.publish(
        root, metadata(metrics={"pr_auc": 0.8}), {repository.MODEL_FILE: model_file}
    )
    assert first == root / "fraud-lgbm" / "1"
    assert second == root / "fraud-lgbm" / "2"
    assert repository.latest_version(root) == "2"
    latest, folder = repository.load(root)
    assert (latest.version, folder) == ("2", second)
    assert latest.metrics == {"pr_auc": 0.8}
    older, _ = repository.load(root, "fraud-lgbm", "1")
    assert older.version == "1"
    assert (first / repository.MODEL_FILE).read_bytes() == b"not really onnx"
    # Nothing half-written is left behind.
    assert sorted(p.name for p in (root / "fraud-lgbm").iterdir()) == ["1", "2"]


def test_unknown_version_lists_the_published_ones(tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "models"
    repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
    with pytest.raises(repository.ModelNotFoundError, match=r"published: 1"):
        repository.load(root, "fraud-lgbm", "7")


def test_incomplete_folders_are_not_versions(tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "models"
    (root / "fraud-lgbm" / "5").mkdir(parents=True)  # e.g. a crashed copy by hand
    assert repository.latest_version(root) is None
    published = repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
    assert published.name == "6"


def test_concurrent_publishers_get_distinct_versions(tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "models"
    results: list[Path] = []
    lock = threading.Lock()

    def publish() -> None:
        path = repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
        with lock:
            results.append(path)

    threads = [threading.Thread(target=publish) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(int(p.name) for p in results) == [1, 2, 3, 4, 5, 6]
    for path in results:
        loaded, _ = repository.load(root, "fraud-lgbm", path.name)
        assert loaded.version == path.name


def test_publish_needs_the_model_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=repository.MODEL_FILE):
        repository.publish(tmp_path, metadata(), {})


def test_metadata_validation() -> None:
    with pytest.raises(ValidationError, match="below review"):
        repository.Thresholds(review=0.5, decline=0.2)
    with pytest.raises(ValidationError, match="default_features lacks"):
        metadata(default_features={"amount_eur": 1.0})
    assert metadata().name == repository.DEFAULT_MODEL_NAME


@pytest.mark.parametrize("version", ["0", "1", "42", "9" * repository.MAX_VERSION_DIGITS])
def test_plain_versions_are_accepted(version: str) -> None:
    assert repository.version_problem(version) is None
    repository.check_version("version", version)


@pytest.mark.parametrize("version", PATH_LIKE_VERSIONS)
def test_path_like_versions_are_invalid_naming_the_field(version: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        repository.check_version("parameters[version]", version)
    assert caught.value.field == "parameters[version]"
    # The value echoed back is cut short: a long version never fills a status header.
    assert len(caught.value.message) < 200


@pytest.mark.parametrize(
    "name", ["fraud-lgbm", "m", "Model_2.onnx", "x" * repository.MAX_NAME_LENGTH]
)
def test_plain_names_are_accepted(name: str) -> None:
    assert repository.name_problem(name) is None


@pytest.mark.parametrize("name", PATH_LIKE_NAMES)
def test_path_like_names_are_invalid(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        repository.check_name("model_name", name)
    assert caught.value.field == "model_name"


@pytest.mark.parametrize("version", PATH_LIKE_VERSIONS)
def test_load_refuses_a_path_like_version_that_would_resolve(
    tmp_path: Path, model_file: Path, version: str
) -> None:
    # Every folder a path-like version could reach holds a complete version: a lookup of
    # the path would find one.
    root = tmp_path / "models"
    repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
    repository.publish(root, metadata(name="other"), {repository.MODEL_FILE: model_file})
    (root / "fraud-lgbm" / "latest").symlink_to("1")
    with pytest.raises(InvalidArgument):
        repository.load(root, "fraud-lgbm", version)


def test_folders_that_are_not_plain_versions_are_not_published(
    tmp_path: Path, model_file: Path
) -> None:
    root = tmp_path / "models"
    repository.publish(root, metadata(), {repository.MODEL_FILE: model_file})
    for stray in ("01", "\u00b2", "\u0661"):
        (root / "fraud-lgbm" / stray).mkdir()
        (root / "fraud-lgbm" / stray / repository.METADATA_FILE).write_text("{}")
    assert repository.published_versions(root) == ["1"]
    assert repository.publish(root, metadata(), {repository.MODEL_FILE: model_file}).name == "2"
