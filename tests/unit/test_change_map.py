"""The map in docs/architecture.md for "change how a canary is judged" holds: every file it
lists exists, and every module of the product that names the canary policy is listed, so a
new user of the policy cannot be left off the map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Change how a canary is judged"
POLICY_NAMES = re.compile(
    r"\b(CanaryPolicy|CanarySettings|canary_policy|CanaryLimits|RolloutPolicy)\b"
)


def _section() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index(HEADING) + len(HEADING)
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else None]


def _listed() -> set[str]:
    return set(re.findall(r"`((?:services|tests|docs)/[\w/.]+)`", _section()))


def test_every_listed_file_exists() -> None:
    listed = _listed()
    assert len(listed) >= 10, listed
    missing = sorted(p for p in listed if not (ROOT / p).is_file())
    assert not missing, missing


def test_every_module_that_names_the_policy_is_listed() -> None:
    naming = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "services").rglob("*.py")
        if POLICY_NAMES.search(path.read_text())
    }
    assert "services/domain/canary.py" in naming  # the scan finds the policy's own module
    assert not naming - _listed(), sorted(naming - _listed())


def test_the_judges_and_their_tests_are_on_the_map() -> None:
    listed = _listed()
    for must in (
        "services/gateway/canary.py",
        "services/monitor/controller.py",
        "services/cli/model.py",
        "docs/lifecycle.md",
        "tests/unit/test_canary_policy.py",
    ):
        assert must in listed, must
