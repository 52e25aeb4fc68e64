"""Bad CLI input to every ``fraudmesh`` command: exit 2 before any work, one line on stderr naming
the command and the option, no traceback, and nothing written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import typer
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from services.cli import checks
from services.cli.main import COMMANDS_GROUP, app
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
    "an unknown feature": (("--feature", "shoe_size"), "--feature"),
    "a default input added": (("--feature", "amount_eur"), "--feature"),
    "a feature added twice": (("--feature", "merchant_country", "--feature", "merchant_country"), "--feature"),
    "an unknown choice of optional features": (("--optional-features", "some"), "--optional-features"),
}  # fmt: skip


BOX_DRAWING = {chr(c) for c in range(0x2500, 0x2580)}


def _assert_one_line(command: str, named: str, err: str) -> None:
    """``err`` is one line, ``fraudmesh COMMAND: …``, naming ``named``, without a frame."""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err
    assert lines[0].startswith(f"fraudmesh {command}".rstrip() + ": "), err
    assert named in lines[0], err
    assert not BOX_DRAWING & set(err), err


# Checked by Typer itself; the rest by the commands (``exits.bad_option``), in the same words.
TYPER_OWN = {
    "not a date",
    "a time where a day is expected",
    "decisions without --from-decisions",
    "a negative seed",
    "a seed beyond 32 bits",
    "NaN tolerance",
    "an infinite latency ratio",
    "card precision at 0",
    "an unknown choice of optional features",
}


def _assert_names(command: str, case: str, option: str, err: str) -> None:
    _assert_one_line(command, option, err)
    if case not in TYPER_OWN:
        assert err.startswith(f"fraudmesh {command}: Invalid value for '{option}': "), err


@pytest.mark.parametrize("case", list(TRAIN))
def test_train_rejects_bad_options_before_any_work(place: Path, case: str) -> None:
    args, option = TRAIN[case]
    args = tuple(a.format(place=place) for a in args)
    given = ("--var-dir", str(place / "var")) if "--var-dir" not in args else ()
    code, err = _run(place, "train", *given, *args)
    assert code == 2, err
    _assert_names("train", case, option, err)


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
    _assert_names("decisions export", case, option, err)


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
    assert code == 2, err
    _assert_one_line(f"decisions {args[0]}", option, err)


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
        with pytest.raises(typer.BadParameter) as caught:
            checks.ordered(*bounds, touching=touching)
        assert caught.value.exit_code == 2
        assert caught.value.format_message().startswith(f"Invalid value for '{bounds[-1][0]}': ")


def test_score_refuses_a_negative_amount_before_calling(place: Path) -> None:
    args = ("--card-id", "c", "--merchant-id", "m", "--target", "127.0.0.1:9")
    code, err = _run(place, "score", *args, "--amount-minor", "-1")
    assert code == 2, err
    _assert_one_line("score", "--amount-minor", err)


@pytest.fixture(scope="module")
def installed() -> Iterator[typer.Typer]:
    """``fraudmesh`` as its console script builds it: the product's commands and those that
    join through the entry points (the load-test suite's ``loadtest`` and ``chaos``)."""
    before = list(app.registered_commands)
    joining = list(entry_points(group=COMMANDS_GROUP))
    assert joining, "the load-test suite is not installed beside the product"
    for entry in joining:
        entry.load()(app)
    yield app
    app.registered_commands[:] = before


def _paths(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], bool]]:
    """Every command under ``command`` with its path, and whether it is a group."""
    if isinstance(command, TyperGroup):
        if path:
            yield path, True
        # Through the group's lookup: the root imports its commands' modules on first use.
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, (path, name)
            yield from _paths(sub, (*path, name))
    else:
        yield path, False


def test_every_command_and_group_is_walked(installed: typer.Typer) -> None:
    paths = {" ".join(p) for p, _ in _paths(typer.main.get_command(installed))}
    assert {"train", "score", "model canary", "data import", "loadtest", "chaos"} <= paths


def test_every_command_rejects_an_unknown_option_in_one_line(
    place: Path, installed: typer.Typer
) -> None:
    everything = [p for p, _ in _paths(typer.main.get_command(installed))]
    for path in [(), *everything]:
        code, err = _run(place, *path, "--no-such-option")
        assert code == 2, (path, err)
        _assert_one_line(" ".join(path), "--no-such-option", err)


def test_every_group_rejects_an_unknown_command_in_one_line(
    place: Path, installed: typer.Typer
) -> None:
    groups = [p for p, group in _paths(typer.main.get_command(installed)) if group]
    for path in [(), *groups]:
        code, err = _run(place, *path, "no-such-command")
        assert code == 2, (path, err)
        _assert_one_line(" ".join(path), "'no-such-command'", err)


# command, its arguments, what the line must name
USAGE: dict[str, tuple[str, tuple[str, ...], str]] = {
    "an unparseable integer": ("train", ("--seed", "x"), "'--seed'"),
    "an option without its value": ("train", ("--seed",), "'--seed'"),
    "an unparseable date": ("features simulate", ("--end", "2026-02-30"), "'--end'"),
    "a value not among the choices": ("features simulate", ("--preset", "huge"), "'--preset'"),
    "a number below its range": ("certs", ("--days", "0"), "'--days'"),
    "a missing required option": ("token", (), "'--subject'"),
    "a missing argument": ("data import", (), "'path'"),
    "an extra argument": ("data import", ("a.csv", "b.csv"), "b.csv"),
    "a value given to a flag": ("score", ("--tls=yes",), "'--tls'"),
    "an unparseable float": ("model canary", ("3", "--percent", "half"), "'--percent'"),
    "a missing version": ("model promote", (), "'version'"),
    "an option of a nested command without its value": (
        "decisions tail", ("--interval-s",), "'--interval-s'"
    ),
    "a bad number to the load test": ("loadtest", ("--step-seconds", "x"), "'--step-seconds'"),
    "an unknown fault row": ("chaos", ("--rows", "nope"), "--rows"),
    "a bad rate to the fault matrix": ("chaos", ("--rps", "1.5"), "'--rps'"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(USAGE))
def test_usage_errors_are_one_line_naming_the_command_and_option(
    place: Path, installed: typer.Typer, case: str
) -> None:
    command, args, named = USAGE[case]
    code, err = _run(place, *command.split(), *args)
    assert code == 2, err
    _assert_one_line(command, named, err)


def test_a_control_character_in_a_value_stays_on_the_line(place: Path) -> None:
    code, err = _run(place, "model", "no\nsuch")
    assert code == 2, err
    _assert_one_line("model", "'no\\nsuch'", err)


def test_help_is_unchanged_and_no_arguments_show_it(place: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0 and "--seed" in result.stdout and not result.stderr
    assert BOX_DRAWING & set(result.stdout), "the help is no longer Typer's rich help"
    result = CliRunner().invoke(app, ["model"])
    assert "promote" in result.stdout and not result.stderr


FRAUDMESH = Path(sys.executable).parent / "fraudmesh"


@pytest.mark.parametrize(
    ("args", "command", "named"),
    [
        (("train", "--seed", "x"), "train", "'--seed'"),
        (("loadtest", "--rates-per-second", "1"), "loadtest", "--rates-per-second"),
        (("chaos", "--duration-s", "soon"), "chaos", "'--duration-s'"),
        (("no-such-command",), "", "'no-such-command'"),
    ],
)
def test_the_console_script_prints_one_line(
    tmp_path: Path, args: tuple[str, ...], command: str, named: str
) -> None:
    """The installed script itself, no test runner around it: the entry-point commands too."""
    ran = subprocess.run(
        [str(FRAUDMESH), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 2, ran.stderr
    assert not ran.stdout and "Traceback" not in ran.stderr
    _assert_one_line(command, named, ran.stderr)
    assert not list(tmp_path.iterdir())


def test_up_refuses_a_second_decision_sink_on_the_file_log(place: Path) -> None:
    code, err = _run(place, "up", "--var-dir", str(place / "var"), "--decisionlog-replicas", "2")
    assert code == 2, err
    _assert_one_line("up", "--decisionlog-replicas", err)
    assert "Kafka or Redis Streams" in err


def test_up_refuses_a_second_updater_without_kafka(place: Path) -> None:
    code, err = _run(place, "up", "--var-dir", str(place / "var"), "--updater-replicas", "2")
    assert code == 2, err
    _assert_one_line("up", "--updater-replicas", err)
    assert "Kafka event log" in err
