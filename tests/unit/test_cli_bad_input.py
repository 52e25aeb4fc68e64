"""Bad dates, paths and numbers given to ``fraudmesh train`` and ``fraudmesh decisions``: exit 2
before any work, naming the option, and nothing written."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from services.cli import checks
from services.cli.main import app
from services.decisionlog import layout

from .test_decisionlog import decision, write_flush


def _tree(root: Path) -> list[tuple[str, int]]:
    return [(str(p.relative_to(root)), p.stat().st_size) for p in sorted(root.rglob("*"))]


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A folder with a state folder (no dataset), a plain file and a folder to misuse."""
    (tmp_path / "var").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


def _run(place: Path, *args: str) -> tuple[int, str]:
    before = _tree(place)
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert _tree(place) == before, "the command changed files"
    assert "Traceback" not in result.output
    return result.exit_code, result.stderr


TRAIN: dict[str, tuple[tuple[str, ...], str]] = {
    "not a date": (("--train-from", "2026-13-01"), "--train-from"),
    "a time where a day is expected": (("--test-from", "2026-01-01T10:00:00"), "--test-from"),
    "training ends before it starts": (
        ("--train-from", "2026-02-01", "--train-until", "2026-01-01"),
        "--train-until",
    ),
    "test starts before training ends": (
        ("--train-until", "2026-02-01", "--test-from", "2026-01-15"),
        "--test-from",
    ),
    "an empty test period": (("--test-from", "2026-02-01", "--test-until", "2026-02-01"), "--test-until"),
    "test ends before training starts": (
        ("--train-from", "2026-03-01", "--test-until", "2026-02-01"),
        "--test-until",
    ),
    "a state folder that does not exist": (("--var-dir", "{place}/nowhere"), "--var-dir"),
    "a state folder that is a file": (("--var-dir", "{place}/a-file"), "--var-dir"),
    "scores to a folder": (("--scores-out", "{place}/a-folder"), "--scores-out"),
    "scores under a file": (("--scores-out", "{place}/a-file/scores.parquet"), "--scores-out"),
    "a report folder that is a file": (("--report-dir", "{place}/a-file"), "--report-dir"),
    "a model root that is a file": (("--model-root", "{place}/a-file"), "--model-root"),
    "a model root under a file": (("--model-root", "{place}/a-file/models"), "--model-root"),
    "decisions without --from-decisions": (("--decisions-since", "2026-01-01"), "--from-decisions"),
    "decisions that end before they start": (
        ("--from-decisions", "--decisions-since", "2026-02-01", "--decisions-until", "2026-01-01"),
        "--decisions-until",
    ),
    "a decision log that does not exist": (
        ("--from-decisions", "--decisions-root", "{place}/nowhere"),
        "--decisions-root",
    ),
    "a work folder that is a file": (("--from-decisions", "--work-dir", "{place}/a-file"), "--work-dir"),
    "a negative seed": (("--seed", "-1"), "--seed"),
    "a seed beyond 32 bits": (("--seed", "4294967296"), "--seed"),
    "NaN tolerance": (("--ap-tolerance", "nan"), "--ap-tolerance"),
    "an infinite latency ratio": (("--latency-ratio", "inf"), "--latency-ratio"),
    "card precision at 0": (("--card-precision-k", "0"), "--card-precision-k"),
}  # fmt: skip


# Checked by Typer itself (its own format); every other case is one line of ours.
TYPER_OWN = {
    "not a date",
    "a time where a day is expected",
    "decisions without --from-decisions",
    "a negative seed",
    "a seed beyond 32 bits",
    "NaN tolerance",
    "an infinite latency ratio",
    "card precision at 0",
}


def _assert_names(case: str, option: str, err: str) -> None:
    if case in TYPER_OWN:
        assert option in err, err
    else:
        assert err.strip().startswith(f"Invalid value for '{option}': "), err
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("case", list(TRAIN))
def test_train_rejects_bad_options_before_any_work(place: Path, case: str) -> None:
    args, option = TRAIN[case]
    args = tuple(a.format(place=place) for a in args)
    given = ("--var-dir", str(place / "var")) if "--var-dir" not in args else ()
    code, err = _run(place, "train", *given, *args)
    assert code == 2, err
    _assert_names(case, option, err)


EXPORT: dict[str, tuple[tuple[str, ...], str]] = {
    "not a date": (("--since", "2026-02-30"), "--since"),
    "a window that ends before it starts": (
        ("--since", "2026-02-01", "--until", "2026-01-31T23:00:00"),
        "--until",
    ),
    "an empty window": (("--since", "2026-02-01", "--until", "2026-02-01"), "--until"),
    "out to a folder": (("--out", "{place}/a-folder"), "--out"),
    "out under a file": (("--out", "{place}/a-file/x.parquet"), "--out"),
}


@pytest.mark.parametrize("case", list(EXPORT))
def test_export_rejects_bad_options_before_reading(place: Path, case: str) -> None:
    args, option = EXPORT[case]
    args = tuple(a.format(place=place) for a in args)
    out = () if "--out" in args else ("--out", str(place / "x.parquet"))
    code, err = _run(place, "decisions", "export", "--root", str(place / "var"), *out, *args)
    assert code == 2, err
    _assert_names(case, option, err)


@pytest.mark.parametrize(
    ("root", "says"),
    [("nowhere", "does not exist"), ("a-file", "is a file, not a folder")],
)
def test_export_of_a_missing_log_exits_2_in_one_line(place: Path, root: str, says: str) -> None:
    code, err = _run(
        place, "decisions", "export", "--root", str(place / root), "--out", str(place / "x.pq")
    )
    assert code == 2
    assert (
        err.strip()
        == f"export rejected: the decision log {place / root} {says} (--root or --var-dir)"
    )


def test_export_of_a_log_with_a_corrupt_part_exits_2_naming_it(place: Path) -> None:
    log = place / "var" / "decisions-log"
    write_flush(log, 1, [decision("e1", "tx-1")])
    (_, day), *_ = layout.day_dirs(log, "decisions")
    corrupt = day / layout.part_name(2)
    corrupt.write_bytes((day / layout.part_name(1)).read_bytes()[:200])
    out = place / "out" / "decisions.parquet"
    code, err = _run(place, "decisions", "export", "--root", str(log), "--out", str(out))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"export rejected: a part of the decision log in {log} is corrupt")
    assert str(corrupt) in err
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("tail", "--last", "-1"), "--last"),
        (("tail", "--interval-s", "0"), "--interval-s"),
        (("tail", "--interval-s", "nan"), "--interval-s"),
        (("compact", "--older-than-days", "-2"), "--older-than-days"),
    ],
)
def test_tail_and_compact_reject_bad_numbers(
    place: Path, args: tuple[str, ...], option: str
) -> None:
    code, err = _run(place, "decisions", *args, "--root", str(place / "var"))
    assert code == 2 and option in err, err


def _at(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 1, day, hour, tzinfo=UTC)


def test_ordered_bounds_skip_the_missing_and_let_one_pair_touch() -> None:
    touching = ("b", "c")
    checks.ordered(("a", _at(1)), ("b", _at(2)), ("c", _at(2)), ("d", _at(3)), touching=touching)
    checks.ordered(("a", _at(1)), ("b", None), ("c", _at(2)), ("d", None), touching=touching)
    for bounds in (
        [("a", _at(2)), ("b", _at(2))],  # strict
        [("a", _at(2)), ("b", None), ("c", _at(2))],  # a < b <= c: a < c
        [("b", _at(2)), ("c", None), ("d", _at(2))],  # b <= c < d: b < d
        [("c", _at(3)), ("d", _at(2, 23))],
    ):
        with pytest.raises(typer.Exit) as caught:
            checks.ordered(*bounds, touching=touching)
        assert caught.value.exit_code == 2


def test_score_refuses_a_negative_amount_before_calling(place: Path) -> None:
    args = ("--card-id", "c", "--merchant-id", "m", "--target", "127.0.0.1:9")
    code, err = _run(place, "score", *args, "--amount-minor", "-1")
    assert code == 2 and "--amount-minor" in err, err
