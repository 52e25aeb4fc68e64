"""The model lifecycle: states, routing, refusals, audit trail, migration, concurrency."""

from __future__ import annotations

import json
import multiprocessing
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.models import repository
from services.models.lifecycle import (
    ROUTING_FILE,
    Canary,
    GateCheck,
    GateReport,
    LifecycleError,
    LifecycleState,
    ModelLifecycle,
    UnknownVersionError,
    VersionState,
)

from .tiny_models import metadata

NAME = repository.DEFAULT_MODEL_NAME
AT = datetime(2026, 5, 1, 12, tzinfo=UTC)


def _gates(passed: bool) -> GateReport:
    check = GateCheck(name="average_precision", passed=passed, value=0.5, limit=0.6, detail="x")
    return GateReport(passed=passed, checks=[check], against="1", evaluated_at=AT)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "staged.onnx"
    path.write_bytes(b"onnx bytes")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "models"


def _old_publish(root: Path, model_file: Path) -> str:
    """Publishes the way versions were published before the lifecycle existed."""
    return repository.publish(root, metadata(), {repository.MODEL_FILE: model_file}).name


def _candidate(root: Path, model_file: Path, gates: GateReport | None = None) -> str:
    published, _, _ = ModelLifecycle(root).publish_candidate(
        metadata(), {repository.MODEL_FILE: model_file}, gates, by="trainer@ci"
    )
    return published.version


def test_without_a_file_the_highest_version_is_live(root: Path, model_file: Path) -> None:
    assert ModelLifecycle(root).read().routing.live is None
    for _ in range(3):
        _old_publish(root, model_file)
    state = ModelLifecycle(root).read()
    assert state.generation == 0
    assert state.routing.live == "3"
    assert [state.versions[v].state for v in ("1", "2", "3")] == [
        VersionState.RETIRED,
        VersionState.RETIRED,
        VersionState.LIVE,
    ]
    assert not (root / NAME / ROUTING_FILE).exists()


def test_a_published_candidate_does_not_go_live(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    version = _candidate(root, model_file, _gates(True))
    state = ModelLifecycle(root).read()
    assert version == "2"
    assert state.routing.live == "1"
    assert state.versions["2"].state is VersionState.CANDIDATE
    assert state.versions["2"].gates == _gates(True)
    # The migrated view was written first, then the candidate recorded.
    assert [(t.version, t.from_state, t.to_state) for t in state.history] == [
        ("1", None, VersionState.LIVE),
        ("2", None, VersionState.CANDIDATE),
    ]
    assert state.history[-1].by == "trainer@ci"
    assert state.generation == 2


def test_a_folder_published_without_a_record_is_a_candidate(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    ModelLifecycle(root).materialize()
    _old_publish(root, model_file)
    state = ModelLifecycle(root).read()
    assert state.routing.live == "1"
    assert state.versions["2"].state is VersionState.CANDIDATE
    assert state.versions["2"].gates is None


def test_shadow_canary_promote_rollback(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file, _gates(True))
    lc = ModelLifecycle(root)

    change = lc.shadow(new, by="ops")
    assert change.after.shadow == new and change.after.live == "1"
    assert [(t.from_state, t.to_state) for t in change.transitions] == [
        (VersionState.CANDIDATE, VersionState.SHADOW)
    ]

    change = lc.canary(new, 20, by="ops")
    assert change.after.canary == Canary(version=new, percent=20)
    assert change.after.shadow is None
    assert lc.read().traffic("1") == "80%" and lc.read().traffic(new) == "20%"

    change = lc.canary(new, 50, by="ops")
    assert change.after.canary is not None and change.after.canary.percent == 50
    assert change.transitions[0].reason == "canary 20% → 50%"

    change = lc.promote(new, by="ops")
    assert change.after.live == new and change.after.previous == "1"
    assert change.after.canary is None
    state = lc.read()
    assert state.versions["1"].state is VersionState.RETIRED
    assert state.traffic("1") == "standby" and state.traffic(new) == "100%"

    change = lc.rollback(by="ops", reason="complaints")
    assert change.after.live == "1" and change.after.previous is None
    state = lc.read()
    assert state.versions[new].state is VersionState.RETIRED
    assert state.versions[new].reason == "complaints"
    assert [(t.version, t.to_state) for t in state.history[-2:]] == [
        (new, VersionState.RETIRED),
        ("1", VersionState.LIVE),
    ]
    generations = [t.generation for t in state.history]
    assert generations == sorted(generations) and generations[-1] == state.generation


def test_refusals_say_why(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    good = _candidate(root, model_file, _gates(True))
    bad = _candidate(root, model_file, _gates(False))
    lc = ModelLifecycle(root)
    with pytest.raises(UnknownVersionError, match="published: 1, 2, 3"):
        lc.canary("9", 10)
    with pytest.raises(LifecycleError, match="failed its gates, promote refused"):
        lc.promote(bad)
    with pytest.raises(LifecycleError, match="failed its gates, canary refused"):
        lc.canary(bad, 5)
    with pytest.raises(LifecycleError, match="already live"):
        lc.promote("1")
    with pytest.raises(LifecycleError, match="is live"):
        lc.retire("1")
    with pytest.raises(LifecycleError, match="no previous live version"):
        lc.rollback()
    lc.canary(good, 10)
    lc.shadow(bad)  # a shadow beside the canary is fine, a second canary is not
    with pytest.raises(LifecycleError, match=f"v{good} is already in canary"):
        lc.canary(bad, 10)
    with pytest.raises(Exception, match="percent"):
        lc.canary(good, 0)
    lc.retire(good)
    with pytest.raises(LifecycleError, match="retired"):
        lc.canary(good, 10)
    # Refused changes leave no trace.
    assert lc.read().history[-1].to_state is VersionState.RETIRED


def test_shadow_is_allowed_for_a_version_that_failed_its_gates(
    root: Path, model_file: Path
) -> None:
    _old_publish(root, model_file)
    bad = _candidate(root, model_file, _gates(False))
    assert ModelLifecycle(root).shadow(bad).after.shadow == bad


def test_promote_without_gates_is_noted(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    ModelLifecycle(root).materialize()
    _old_publish(root, model_file)
    change = ModelLifecycle(root).promote("2")
    assert any("without gates" in note for note in change.notes)


def test_nothing_to_do_changes_nothing(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    lc = ModelLifecycle(root)
    lc.shadow(new)
    key, generation = lc.file_key(), lc.read().generation
    change = lc.shadow(new)
    assert not change.changed and change.notes
    assert lc.file_key() == key and lc.read().generation == generation


def test_retiring_the_rollback_target_drops_it(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    lc = ModelLifecycle(root)
    lc.promote(new)
    change = lc.retire("1")
    assert change.after.previous is None
    assert change.after.kept_loaded() == [new]


def test_automatic_rollback_is_conditional_on_the_generation(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    lc = ModelLifecycle(root)
    seen = lc.canary(new, 20).generation
    assert lc.abort_canary(new, seen - 1, "stale view") is None
    change = lc.abort_canary(new, seen, "decline rate 90% vs 1%", by="gateway:1")
    assert change is not None
    state = lc.read()
    assert state.routing.canary is None and state.routing.live == "1"
    assert state.versions[new].state is VersionState.RETIRED
    assert state.versions[new].reason == "automatic rollback: decline rate 90% vs 1%"
    assert state.history[-1].by == "gateway:1"
    assert lc.abort_canary(new, state.generation, "again") is None


def _abort(args: tuple[str, str, int, str]) -> bool:
    root, version, generation, who = args
    return (
        ModelLifecycle(Path(root)).abort_canary(version, generation, "breach", by=who) is not None
    )


def test_exactly_one_of_several_processes_writes_the_rollback(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    generation = ModelLifecycle(root).canary(new, 20).generation
    jobs = [(str(root), new, generation, f"gateway:{i}") for i in range(6)]
    with multiprocessing.get_context("fork").Pool(6) as pool:
        won = pool.map(_abort, jobs)
    assert sum(won) == 1
    state = ModelLifecycle(root).read()
    retired = [t for t in state.history if t.version == new and t.to_state is VersionState.RETIRED]
    assert len(retired) == 1
    assert state.generation == generation + 1


def test_readers_never_see_a_partial_file(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    lc = ModelLifecycle(root)
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = 0

    def read() -> None:
        nonlocal reads
        while not stop.is_set():
            try:
                LifecycleState.model_validate_json((root / NAME / ROUTING_FILE).read_text())
                reads += 1
            except BaseException as error:
                errors.append(error)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for percent in range(1, 60):
            lc.canary(new, percent)
    finally:
        stop.set()
        reader.join()
    assert not errors and reads > 0


def test_file_key_changes_with_every_write(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    lc = ModelLifecycle(root)
    keys = {lc.file_key()}
    for percent in (5, 10, 15):
        lc.canary(new, percent)
        keys.add(lc.file_key())
    assert len(keys) == 4


def test_the_file_is_plain_json_with_the_audit_trail(root: Path, model_file: Path) -> None:
    _old_publish(root, model_file)
    new = _candidate(root, model_file)
    ModelLifecycle(root).canary(new, 12.5, by="ops@desk")
    document = json.loads((root / NAME / ROUTING_FILE).read_text())
    assert document["routing"]["canary"] == {"version": new, "percent": 12.5}
    last = document["history"][-1]
    assert (last["from_state"], last["to_state"], last["by"]) == ("candidate", "canary", "ops@desk")
    assert Canary(version=new, percent=12.5).buckets == 1250
