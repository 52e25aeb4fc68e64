"""The dependency rules in pyproject.toml hold, breaking one is caught, and no import cycle
exists anywhere in the product."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    # The packages are found on PYTHONPATH first, so a copy is checked, not the install.
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{root / 'gen' / 'python'}",
        # One contract a line in the report.
        "COLUMNS": "400",
    }
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.json", "*.png")
    for folder in ("services", "loadtest", "tests"):
        shutil.copytree(REPO / folder, root / folder, ignore=ignore)
    shutil.copytree(REPO / "gen" / "python", root / "gen" / "python", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("services/scorer/servicer.py", "import services.gateway.app", "never import each other"),
        ("services/common/errors.py", "import services.features.app", "Inside the product"),
        ("services/gateway/app.py", "import services.pipelines.simulate", "Serving code"),
        ("services/app_less.py", "import loadtest.runner", "Top level"),
        ("services/domain/money.py", "import grpc", "Only the transport modules"),
        ("services/monitor/engine.py", "import grpc", "Only the transport modules"),
        ("services/gateway/settings.py", "import services.common.server", "Only the transport"),
        ("services/gateway/canary.py", "import services.gateway.routing", "No import cycles"),
    ],
)
def test_breaking_a_rule_fails(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = _copy(tmp_path)
    path = root / module
    text = path.read_text() if path.exists() else '"""A module."""\n'
    path.write_text(text + f"\n{line}  # noqa: E402, F401\n")
    result = _lint(root)
    assert result.returncode != 0, result.stdout
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in b for b in broken), result.stdout


def _modules(root: Path) -> dict[str, Path]:
    """Every module under ``root/services`` by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((root / "services").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that importing ``name`` runs: itself, or the nearest package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Which of our modules each module imports: every import statement, at any depth (in
    functions and ``if TYPE_CHECKING`` blocks too: a deferred import still closes a cycle)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_imported(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                for alias in node.names:
                    # ``from package import module`` imports the module, else the name's home.
                    targets.add(_imported(f"{base}.{alias.name}", modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_anywhere_in_the_product() -> None:
    graph = _import_graph(REPO)
    assert "services.gateway.ports" in graph["services.gateway.pipeline"]
    assert _cycles(graph) == []


@pytest.mark.parametrize(
    ("module", "line", "cycle"),
    [
        (
            "services/gateway/canary.py",
            "from services.gateway import routing",
            ["services.gateway.canary", "services.gateway.routing"],
        ),
        (
            "services/domain/money.py",
            "if TYPE_CHECKING:\n    from ..domain.featurespec import MODEL_FEATURES",
            ["services.domain.featurespec", "services.domain.money"],
        ),
        (
            "services/models/repository.py",
            "def later() -> None:\n    import services.gateway.pipeline",
            ["services.gateway.pipeline", "services.gateway.ports", "services.models.repository"],
        ),
    ],
)
def test_the_scan_finds_a_planted_cycle(
    tmp_path: Path, module: str, line: str, cycle: list[str]
) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "services", root / "services", ignore=shutil.ignore_patterns("*.pyc"))
    path = root / module
    path.write_text(path.read_text() + f"\n{line}\n")
    # The planted import closes a cycle through (at least) these modules.
    assert any(set(cycle) <= set(found) for found in _cycles(_import_graph(root)))


# One job a function and a module: past these sizes a piece of the product is doing several.
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 700


def _oversized(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.count("\n")
        name = path.relative_to(root.parent).as_posix()
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_function_or_module_in_the_product_is_oversized() -> None:
    assert _oversized(REPO / "services") == []


def test_the_size_scan_finds_a_long_function(tmp_path: Path) -> None:
    package = tmp_path / "services"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def long() -> None:\n{body}", encoding="utf-8")
    assert _oversized(package) == [f"services/long.py:1 long: {MAX_FUNCTION_LINES + 1} lines"]
