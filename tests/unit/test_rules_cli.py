"""``fraudmesh rules``: validate, publish, list, promote, show and roll back a policy; bad
input is one line naming the rule and the field, exit 2, and changes nothing."""

from __future__ import annotations

from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from services.cli.main import app
from services.domain.policy import MAX_POLICY_BYTES
from services.models.policies import PolicyStore

runner = CliRunner()

GOOD = """rules:
  - name: cnp-over-5000
    action: decline
    when: {channel: card_not_present, amount_eur: {gt: 5000}}
  - name: watch
    action: review
    mode: shadow
"""


def _rules(folder: Path, *args: str) -> Result:
    return runner.invoke(app, ["rules", *args, "--policy-dir", str(folder)], env={"COLUMNS": "200"})


def _file(tmp_path: Path, text: str | bytes, name: str = "policy.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def test_validate_says_what_the_policy_holds(tmp_path: Path) -> None:
    result = runner.invoke(app, ["rules", "validate", _file(tmp_path, GOOD)])
    assert result.exit_code == 0, result.output
    assert "1 live rules, 1 in shadow" in result.output


def test_the_whole_cycle(tmp_path: Path) -> None:
    folder = tmp_path / "policy"
    path = _file(tmp_path, GOOD)
    published = _rules(folder, "publish", path)
    assert published.exit_code == 0, published.output
    assert "v1 as a candidate" in published.output
    assert PolicyStore(folder).read_state().live is None
    promoted = _rules(folder, "promote", "1")
    assert promoted.exit_code == 0 and "policy v1 live" in promoted.output
    listed = _rules(folder, "list")
    assert listed.exit_code == 0
    assert "│ 1       │ live  │ 1          │ 1            │" in listed.output
    shown = _rules(folder, "show")
    assert shown.exit_code == 0 and shown.output == GOOD
    rolled = _rules(folder, "rollback")
    assert rolled.exit_code == 0 and "no policy live" in rolled.output
    assert PolicyStore(folder).read_state().live is None


def _one_line_error(result: Result, code: int, *parts: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    for part in parts:
        assert part in lines[0], lines[0]


def test_a_bad_policy_is_one_line_naming_rule_and_field_and_changes_nothing(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "policy"
    assert _rules(folder, "publish", _file(tmp_path, GOOD)).exit_code == 0
    assert _rules(folder, "promote", "1").exit_code == 0
    key = PolicyStore(folder).file_key()
    bad = _file(tmp_path, GOOD.replace("amount_eur: {gt: 5000}", "amount_eur: {gt: lots}"), "b.y")
    for command in ("validate", "publish"):
        args = (
            [command, bad] if command == "validate" else [command, bad, "--policy-dir", str(folder)]
        )
        result = runner.invoke(app, ["rules", *args], env={"COLUMNS": "200"})
        _one_line_error(result, 2, "rule 'cnp-over-5000'", "field 'when.amount_eur.gt'")
    assert PolicyStore(folder).file_key() == key
    assert PolicyStore(folder).published() == ["1"]


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    cases = {
        "missing": (str(tmp_path / "none.yaml"), "cannot read"),
        "binary": (_file(tmp_path, b"\xff\xfe\x00rules", "bin.yaml"), "not UTF-8"),
        "huge": (_file(tmp_path, "#" * (MAX_POLICY_BYTES + 1), "huge.yaml"), "larger than"),
        "folder": (str(tmp_path), "cannot read"),
    }
    for path, problem in cases.values():
        result = runner.invoke(app, ["rules", "validate", path])
        _one_line_error(result, 2, "validate rejected", problem)


def test_refusals_exit_1_and_unknown_versions_exit_2(tmp_path: Path) -> None:
    folder = tmp_path / "policy"
    _one_line_error(_rules(folder, "rollback"), 1, "nothing to roll back to")
    _one_line_error(_rules(folder, "show"), 1, "no policy is live")
    _one_line_error(_rules(folder, "promote", "4"), 2, "no policy version 4")
    _one_line_error(_rules(folder, "promote", "../../x"), 2, "not a policy version number")
    assert _rules(folder, "publish", _file(tmp_path, GOOD)).exit_code == 0
    assert _rules(folder, "promote", "1").exit_code == 0
    _one_line_error(_rules(folder, "promote", "1"), 1, "already live")


def test_the_default_folder_is_the_state_folders(tmp_path: Path) -> None:
    path = _file(tmp_path, GOOD)
    result = runner.invoke(app, ["rules", "publish", path, "--var-dir", str(tmp_path / "var")])
    assert result.exit_code == 0, result.output
    assert PolicyStore.in_state_folder(tmp_path / "var").published() == ["1"]
