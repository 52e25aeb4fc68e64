"""``fraudmesh model import``: a folder trained elsewhere is validated before anything is
published; each problem is one line naming the file and field, exit 2, nothing published."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from services.cli.main import app
from services.domain.featurespec import MODEL_FEATURES
from services.models import repository
from services.pipelines import importing

from .tiny_models import N_FEATURES, onnx_model

runner = CliRunner()


def _spec(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "feature_order": list(MODEL_FEATURES),
        "input_name": "input",
        "output_name": "probabilities",
        "thresholds": {"review": 0.3, "decline": 0.8},
        "default_features": dict.fromkeys(MODEL_FEATURES, 0.0),
    }
    spec.update(changes)
    return spec


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onnx_model(tmp_path_factory.mktemp("onnx") / "model.onnx")


def _folder(tmp_path: Path, model_file: Path, **changes: object) -> Path:
    folder = tmp_path / "bring"
    folder.mkdir(exist_ok=True)
    (folder / "model.onnx").write_bytes(model_file.read_bytes())
    (folder / "metadata.json").write_text(json.dumps(_spec(**changes)))
    return folder


def test_a_valid_folder_passes_and_its_model_answers(tmp_path: Path, model_file: Path) -> None:
    checked = importing.validate(_folder(tmp_path, model_file))
    scores = checked.model.predict(np.zeros((3, N_FEATURES), np.float32))
    assert scores.shape == (3,) and ((scores >= 0) & (scores <= 1)).all()


def _problem(folder: Path) -> str:
    with pytest.raises(importing.ImportProblem) as caught:
        importing.validate(folder)
    return str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path, model_file: Path) -> None:
    folder = _folder(tmp_path, model_file)
    (folder / "metadata.json").unlink()
    assert _problem(folder) == f"metadata.json is missing in {folder}"
    folder = _folder(tmp_path, model_file)
    (folder / "model.onnx").unlink()
    assert _problem(folder) == f"model.onnx is missing in {folder}"


def test_an_unknown_or_missing_feature_is_named(tmp_path: Path, model_file: Path) -> None:
    order = [*MODEL_FEATURES[:-1], "shoe_size"]
    assert "unknown feature 'shoe_size'" in _problem(
        _folder(tmp_path, model_file, feature_order=order)
    )
    short = list(MODEL_FEATURES[:-1])
    assert f"lacks {MODEL_FEATURES[-1]!r}" in _problem(
        _folder(tmp_path, model_file, feature_order=short)
    )
    swapped = [MODEL_FEATURES[1], MODEL_FEATURES[0], *MODEL_FEATURES[2:]]
    assert "order" in _problem(_folder(tmp_path, model_file, feature_order=swapped))
    defaults = dict.fromkeys(MODEL_FEATURES[1:], 0.0)
    assert f"default_features lacks {MODEL_FEATURES[0]!r}" in _problem(
        _folder(tmp_path, model_file, default_features=defaults)
    )


@pytest.fixture(scope="module")
def wider_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onnx_model(tmp_path_factory.mktemp("onnx") / "model.onnx", extra=1)


ADDED_ORDER = [*MODEL_FEATURES, "merchant_country"]


def test_a_version_trained_with_an_added_servable_feature_is_accepted(
    tmp_path: Path, wider_file: Path
) -> None:
    folder = _folder(
        tmp_path, wider_file, feature_order=ADDED_ORDER,
        default_features=dict.fromkeys(ADDED_ORDER, 0.0),
    )  # fmt: skip
    checked = importing.validate(folder)
    assert checked.model.metadata.feature_order == ADDED_ORDER
    assert checked.model.n_features == N_FEATURES + 1
    scores = checked.model.predict(np.zeros((3, N_FEATURES + 1), np.float32))
    assert scores.shape == (3,)


@pytest.mark.parametrize(
    ("order", "defaults", "expected"),
    [
        (
            [*MODEL_FEATURES, "shoe_size"],
            None,
            "feature_order: unknown feature 'shoe_size' (servable: the "
            f"{N_FEATURES} default inputs",
        ),
        (
            [*MODEL_FEATURES, "merchant_country", "merchant_country"],
            None,
            "feature_order: 'merchant_country' is named twice",
        ),
        (
            ["merchant_country", *MODEL_FEATURES],
            None,
            "feature_order is not in the feature spec's order: 'merchant_country' where "
            f"{MODEL_FEATURES[0]!r} is",
        ),
        (
            ADDED_ORDER,
            dict.fromkeys(MODEL_FEATURES, 0.0),
            "default_features lacks 'merchant_country'",
        ),
        (
            list(MODEL_FEATURES),
            dict.fromkeys(ADDED_ORDER, 0.0),
            "default_features: not an input 'merchant_country'",
        ),
    ],
)
def test_an_added_feature_is_checked_by_name(
    tmp_path: Path,
    wider_file: Path,
    order: list[str],
    defaults: dict[str, float] | None,
    expected: str,
) -> None:
    defaults = defaults if defaults is not None else dict.fromkeys(order, 0.0)
    problem = _problem(
        _folder(tmp_path, wider_file, feature_order=order, default_features=defaults)
    )
    assert expected in problem, problem
    if "unknown" in expected:
        assert "card_last_txn_s, card_home_country, merchant_country" in problem


def test_a_model_narrower_than_its_order_is_refused(tmp_path: Path, model_file: Path) -> None:
    folder = _folder(
        tmp_path, model_file, feature_order=ADDED_ORDER,
        default_features=dict.fromkeys(ADDED_ORDER, 0.0),
    )  # fmt: skip
    assert f"not FP32 [batch, {N_FEATURES + 1}]" in _problem(folder)


@pytest.mark.parametrize(
    ("thresholds", "expected"),
    [
        ({"review": 0.0, "decline": 0.8}, "thresholds.review is 0, not inside (0, 1)"),
        ({"review": 0.3, "decline": 1.0}, "thresholds.decline is 1, not inside (0, 1)"),
        ({"review": 0.3, "decline": 1.5}, "thresholds.decline is 1.5, not inside (0, 1)"),
        ({"review": 0.9, "decline": 0.5}, "decline 0.5 is below review 0.9"),
        ({"review": 0.3}, "thresholds.decline: Field required"),
    ],
)
def test_thresholds_outside_the_open_interval_are_refused(
    tmp_path: Path, model_file: Path, thresholds: dict[str, float], expected: str
) -> None:
    assert expected in _problem(_folder(tmp_path, model_file, thresholds=thresholds))


def test_a_model_that_does_not_load_or_has_other_shapes_is_refused(
    tmp_path: Path, model_file: Path
) -> None:
    folder = _folder(tmp_path, model_file)
    (folder / "model.onnx").write_bytes(b"not a model")
    assert _problem(folder).startswith("model.onnx does not load")
    assert "output_name 'proba'" in _problem(_folder(tmp_path, model_file, output_name="proba"))
    assert "input_name 'x'" in _problem(_folder(tmp_path, model_file, input_name="x"))
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 3])
    y = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 3])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["probabilities"])], "g", [x], [y]
    )
    (narrow / "model.onnx").write_bytes(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9
        ).SerializeToString()
    )
    (narrow / "metadata.json").write_text(json.dumps(_spec()))
    assert f"not FP32 [batch, {N_FEATURES}]" in _problem(narrow)


def test_the_command_prints_one_line_exits_2_and_publishes_nothing(
    tmp_path: Path, model_file: Path
) -> None:
    root = tmp_path / "models"
    folder = _folder(tmp_path, model_file, thresholds={"review": 0.3, "decline": 1.2})
    result = runner.invoke(
        app, ["model", "import", str(folder), "--model-root", str(root)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["import rejected: metadata.json thresholds.decline is 1.2, not inside (0, 1)"]
    assert repository.published_versions(root) == []
    assert not root.exists()
    missing = runner.invoke(
        app, ["model", "import", str(tmp_path / "nowhere"), "--model-root", str(root)]
    )
    assert missing.exit_code == 2 and "is not a folder" in missing.output


def _with_small(tmp_path: Path, model_file: Path, **small: object) -> Path:
    block = {"kind": "distilled", "trees": 20, "num_leaves": 7, "max_depth": 3} | small
    folder = _folder(tmp_path, model_file, small_model=block)
    (folder / repository.SMALL_MODEL_FILE).write_bytes(model_file.read_bytes())
    return folder


def test_a_small_model_comes_with_its_description_and_is_checked_like_the_model(
    tmp_path: Path, model_file: Path
) -> None:
    checked = importing.validate(_with_small(tmp_path, model_file))
    assert checked.small is not None and checked.small_path is not None
    assert checked.small.predict(np.zeros((2, N_FEATURES), np.float32)).shape == (2,)

    folder = _with_small(tmp_path, model_file, thresholds={"review": 0.4, "decline": 0.2})
    assert _problem(folder) == (
        "metadata.json small_model.thresholds: decline 0.2 is below review 0.4"
    )
    folder = _with_small(tmp_path, model_file)
    (folder / repository.SMALL_MODEL_FILE).write_bytes(b"not a model")
    assert _problem(folder).startswith("small.onnx does not load")
    (folder / repository.SMALL_MODEL_FILE).unlink()
    assert _problem(folder).startswith("small.onnx is missing in")

    (tmp_path / "alone").mkdir()
    alone = _folder(tmp_path / "alone", model_file)
    (alone / repository.SMALL_MODEL_FILE).write_bytes(model_file.read_bytes())
    assert "has no small_model" in _problem(alone)
    (tmp_path / "kind").mkdir()
    unknown = _with_small(tmp_path / "kind", model_file, kind="teacher")
    assert _problem(unknown).startswith("metadata.json small_model.kind")


def _published(tmp_path: Path, model_file: Path, **changes: object) -> Path:
    """A folder as ``fraudmesh train`` publishes it: the repository's metadata, every field."""
    order = list(MODEL_FEATURES)
    metadata = repository.ModelMetadata(
        version="7",
        feature_order=order,
        input_name="input",
        output_name="probabilities",
        thresholds=repository.Thresholds(review=0.3, decline=0.8),
        default_features=dict.fromkeys(order, 0.0),
        metrics={"pr_auc": 0.5},
        training_window=repository.TrainingWindow(
            start="2026-01-01T00:00:00Z",
            end="2026-02-01T00:00:00Z",
            holdout_start="2026-01-25T00:00:00Z",
            train_end="2026-01-25T00:00:00Z",
            validation_start="2026-01-20T00:00:00Z",
        ),
        parity_max_abs_diff=1e-7,
        created_at="2026-02-01T00:00:00Z",
        lightgbm_version="4.6.0",
        onnxmltools_version="1.14.0",
        onnxruntime_version="1.22.0",
        params={"seed": 7},
        small_model=repository.SmallModel(
            kind="distilled",
            trees=20,
            num_leaves=7,
            max_depth=3,
            clear_approve=0.01,
            max_fraud_loss=0.005,
            loss_confidence=0.9,
            thresholds=repository.Thresholds(review=0.2, decline=0.7),
            parity_max_abs_diff=1e-7,
            candidates=[{"kind": "distilled", "average_precision": 0.4}],
        ),
    )
    folder = tmp_path / "published"
    folder.mkdir(exist_ok=True)
    (folder / "model.onnx").write_bytes(model_file.read_bytes())
    (folder / repository.SMALL_MODEL_FILE).write_bytes(model_file.read_bytes())
    spec = json.loads(metadata.model_dump_json())
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        target = spec
        for part in parents:
            target = target[part]
        target[last] = value
    (folder / "metadata.json").write_text(json.dumps(spec))
    return folder


def test_a_folder_published_by_training_imports_as_it_is(tmp_path: Path, model_file: Path) -> None:
    checked = importing.validate(_published(tmp_path, model_file))
    assert checked.small is not None
    assert checked.spec.small_model is not None
    assert checked.spec.small_model.clear_approve == 0.01
    # The trainer's library versions come along; its version number does not.
    assert checked.model.metadata.lightgbm_version == "4.6.0"
    assert checked.model.metadata.version == "0"


@pytest.mark.parametrize(
    ("change", "value", "expected"),
    [
        ("shoe_size", 42, "metadata.json shoe_size: Extra inputs are not permitted"),
        (
            "small_model.teacher",
            "x",
            "metadata.json small_model.teacher: Extra inputs are not permitted",
        ),
        (
            "training_window.shoe_size",
            1,
            "metadata.json training_window.shoe_size: Extra inputs are not permitted",
        ),
        ("small_model.clear_approve", 1.5, "metadata.json small_model.clear_approve: Input"),
        ("created_at", "yesterday", "metadata.json created_at: Input"),
        ("parity_max_abs_diff", -1, "metadata.json parity_max_abs_diff: Input"),
        ("training_window.start", "soon", "metadata.json training_window.start: Input"),
    ],
)
def test_a_published_folder_with_an_unknown_or_malformed_field_is_refused_by_name(
    tmp_path: Path, model_file: Path, change: str, value: object, expected: str
) -> None:
    assert _problem(_published(tmp_path, model_file, **{change: value})).startswith(expected)
