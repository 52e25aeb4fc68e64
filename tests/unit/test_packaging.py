"""What each distribution ships: the product's wheel holds no load-test suite, and the suite's
wheel (loadtest/pyproject.toml) holds the suite and the commands it adds to ``fraudmesh``."""

from __future__ import annotations

import email.parser
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMMANDS_GROUP = "fraudmesh.commands"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout without its build and state folders: setuptools puts whatever
    an earlier build left in build/lib into a new wheel, so a build in place could show
    what an old layout shipped rather than what the project declares."""
    root = tmp_path_factory.mktemp("source") / "fraudmesh"
    ignore = shutil.ignore_patterns(
        ".*", "__pycache__", "*.egg-info", "build", "var", "results", "node_modules"
    )
    shutil.copytree(REPO, root, ignore=ignore)
    return root


def _wheel(project: Path, out: Path) -> zipfile.ZipFile:
    """Builds ``project``'s wheel (no dependencies, with the environment's setuptools, offline)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(out),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _metadata(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = (n for n in wheel.namelist() if n.endswith(f".dist-info/{name}"))
    return wheel.read(path).decode()


def _runtime_requirements(wheel: zipfile.ZipFile) -> set[str]:
    """Names of the wheel's dependencies outside any extra."""
    message = email.parser.Parser().parsestr(_metadata(wheel, "METADATA"))
    names = set()
    for requirement in message.get_all("Requires-Dist") or []:
        if "extra ==" in requirement:
            continue
        name = requirement.split(";")[0].strip()
        for separator in "[<>=!~ ":
            name = name.split(separator)[0]
        names.add(name.lower())
    return names


def test_the_product_wheel_holds_no_load_test_suite(source: Path, tmp_path: Path) -> None:
    wheel = _wheel(source, tmp_path)
    names = wheel.namelist()
    assert any(n.startswith("services/gateway/") for n in names), names[:20]
    assert any(n.startswith("fraud/v1/") for n in names), names[:20]
    shipped = [n for n in names if n.split("/")[0] == "loadtest" or "/loadtest/" in n]
    assert shipped == []
    entry_points = next(
        (wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), ""
    )
    assert COMMANDS_GROUP not in entry_points
    # What only the suite or the tests need is not the product's to install.
    assert {"hypothesis", "psutil", "playwright"}.isdisjoint(_runtime_requirements(wheel))


def test_the_product_wheel_holds_the_consoles_pages_and_assets(
    source: Path, tmp_path: Path
) -> None:
    names = set(_wheel(source, tmp_path).namelist())
    console = REPO / "services" / "console"
    shipped = [
        f"services/console/{p.relative_to(console)}"
        for pattern in ("templates/*.html", "static/*.css", "static/vendor/*.js")
        for p in console.glob(pattern)
    ]
    assert "services/console/static/vendor/htmx.min.js" in shipped, "run `make install`"
    assert set(shipped) <= names, sorted(set(shipped) - names)


def test_the_suite_wheel_holds_the_suite_and_its_commands(source: Path, tmp_path: Path) -> None:
    wheel = _wheel(source / "loadtest", tmp_path)
    names = set(wheel.namelist())
    modules = {p.name for p in (REPO / "loadtest").glob("*.py")}
    assert {f"loadtest/{m}" for m in modules} <= names
    assert all(n.startswith(("loadtest/", "fraudmesh_loadtest-")) for n in names), names
    assert "loadtest = loadtest.cli:register" in _metadata(wheel, "entry_points.txt")
    assert {"fraudmesh", "hypothesis", "psutil"} <= _runtime_requirements(wheel)


def test_the_installed_commands_come_from_the_suite_alone() -> None:
    """``make install`` installs both: the product declares no command of the suite."""
    product = importlib.metadata.distribution("fraudmesh")
    assert [e for e in product.entry_points if e.group == COMMANDS_GROUP] == []
    suite = importlib.metadata.distribution("fraudmesh-loadtest")
    commands = {e.name: e.value for e in suite.entry_points if e.group == COMMANDS_GROUP}
    assert commands == {"loadtest": "loadtest.cli:register"}
