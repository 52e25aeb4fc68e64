"""The documentation holds: every repository path, module and results file that README.md and
docs/*.md name exists, their relative links resolve, and the figures they quote from a
results file (listed in ``docs/figures.toml``) match that file."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from loadtest import provenance
from loadtest.bench import BENCHES

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
RESULTS = ROOT / "loadtest" / "results"
FIGURES = ROOT / "docs" / "figures.toml"

PATH = re.compile(
    r"(?<![\w./-])((?:services|loadtest|tests|deploy|scripts|protos|clients|gen|docs)/"
    r"[\w./*<>{},-]*(?:\[[\w.-]+\][\w./*<>{},-]*)*)"
)
"""A repository path: a top-level folder, then path characters; ``<name>``, ``{a,b}``,
``[optional]`` and ``*`` stand for parts that vary."""
MODULE = re.compile(r"(?<![\w./-])((?:services|loadtest|tests)(?:\.\w+)+)")
"""A dotted module name, optionally followed by a name defined in it."""
RESULT_NAME = re.compile(
    r"(?<![\w./-])((?:bench|compare|loadtest|liveloop|freshness|emit|external|profile|quality|"
    r"scale)[\w<>{},.\[\]*-]*?\.(?:md|json|png|txt|\*))(?![\w-])"
)
"""A results file named without its folder (``bench-floor.md``, ``liveloop-<store>.md``)."""
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")

NOT_PATHS = {
    "deploy/admin": "a kubectl resource (the admin Deployment), not a path",
    "loadtest/results/scale": "an output prefix given to --out (scale.md, .json, .png)",
}
"""Tokens that look like paths but name something else."""


def _doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def _glob(token: str) -> str:
    """The token as a glob: varying parts (``<…>``, ``{…}``, ``[…]``) match anything."""
    return re.sub(r"<[^>]*>|\{[^}]*\}|\[[^\]]*\]", "*", token)


def _named(pattern: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for token in sorted({m.group(1) for m in pattern.finditer(doc.read_text())}):
            yield _doc_id(doc), token


def _path_cases() -> list[tuple[str, str]]:
    cases = []
    for doc, token in _named(PATH):
        token = token.rstrip(".,;:")
        if token not in NOT_PATHS:
            cases.append((doc, token))
    return cases


@pytest.mark.parametrize(("doc", "token"), _path_cases())
def test_every_named_path_exists(doc: str, token: str) -> None:
    pattern = _glob(token.rstrip("/"))
    found = list(ROOT.glob(pattern)) if any(c in pattern for c in "*?") else []
    assert (ROOT / pattern).exists() or found, f"{doc} names {token}, which does not exist"


def _top_level_names(source: Path) -> set[str]:
    tree = ast.parse(source.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


@pytest.mark.parametrize(("doc", "token"), list(_named(MODULE)))
def test_every_named_module_exists(doc: str, token: str) -> None:
    parts = token.split(".")
    for end in range(len(parts), 0, -1):
        source = _module_file(parts[:end])
        if source is not None:
            rest = parts[end:]
            assert not rest or rest[0] in _top_level_names(source), (
                f"{doc} names {token}: {'.'.join(parts[:end])} defines no {rest[0]}"
            )
            return
    pytest.fail(f"{doc} names {token}, which is no module")


@pytest.mark.parametrize(("doc", "token"), list(_named(RESULT_NAME)))
def test_every_results_file_named_exists(doc: str, token: str) -> None:
    name = _glob(token.split("/")[0])
    assert list(RESULTS.glob(name)), f"{doc} names {token}: no such file in loadtest/results/"


def _links() -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for match in LINK.finditer(doc.read_text()):
            target = match.group(1)
            if not re.match(r"[a-z]+:", target):
                yield _doc_id(doc), target


@pytest.mark.parametrize(("doc", "target"), list(_links()))
def test_every_relative_link_resolves(doc: str, target: str) -> None:
    assert ((ROOT / doc).parent / target).exists(), f"{doc} links to {target}, which is missing"


# Figures quoted from results files.


def _figures() -> list[dict[str, Any]]:
    return list(tomllib.loads(FIGURES.read_text())["figure"])


def _select(data: Any, key: list[Any], where: str) -> Any:
    """Follows ``key``: a string is a mapping key, an integer a list index, a table picks the
    one list element whose fields equal it."""
    for part in key:
        if isinstance(part, dict):
            matches = [e for e in data if all(e.get(k) == v for k, v in part.items())]
            assert len(matches) == 1, f"{where}: {part} matches {len(matches)} elements"
            data = matches[0]
        else:
            data = data[part]
    return data


def _number(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def _section(text: str, at: int) -> str:
    """The Markdown section (heading to next heading of any level) around offset ``at``."""
    starts = [m.start() for m in re.finditer(r"^#{1,6} ", text, re.MULTILINE)]
    begin = max((s for s in starts if s <= at), default=0)
    end = min((s for s in starts if s > at), default=len(text))
    return text[begin:end]


def _figure_id(figure: dict[str, Any]) -> str:
    return f"{figure['doc']}: {figure['quote'][:60]}"


@pytest.mark.parametrize("figure", _figures(), ids=_figure_id)
def test_quoted_figures_match_their_results_file(figure: dict[str, Any]) -> None:
    doc = ROOT / figure["doc"]
    text = doc.read_text()
    quote = figure["quote"]
    assert quote in text, f"{figure['doc']} no longer says {quote!r}: update docs/figures.toml"
    source = ROOT / figure["file"]
    assert source.is_file(), f"{figure['file']} is missing"
    section = _section(text, text.index(quote))
    assert source.name in section or source.stem in section, (
        f"{figure['doc']}: the section quoting {quote!r} does not name {source.name}"
    )
    data = json.loads(source.read_text())
    for value in figure["values"]:
        shown = value["shown"]
        assert shown in quote, f"{shown!r} is not in the quote {quote!r}"
        where = f"{figure['file']} {value['key']}"
        low, high = _interval(_select(data, value["key"], where))
        if "over" in value:
            below, above = _interval(_select(data, value["over"], where))
            low, high = low / above, high / below
        scale = Decimal(str(value.get("scale", 1)))
        low, high = low * scale, high * scale
        expected = _number(shown)
        half = _half_unit(expected)
        assert expected - half <= high and low <= expected + half, (
            f"{figure['doc']} says {shown} ({quote!r}); {where} holds {low}–{high}"
        )


def _interval(value: Any) -> tuple[Decimal, Decimal]:
    """The values a JSON number stands for: the results files round some (RSS to 0.1 MB,
    latencies to µs), so it is within half a unit of its last digit."""
    number = Decimal(str(value))
    half = _half_unit(number)
    return number - half, number + half


def _half_unit(number: Decimal) -> Decimal:
    """Half a unit of the number's last digit (0.005 for 7.03)."""
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int), f"{number} is not finite"
    return Decimal(5).scaleb(exponent - 1)


def test_every_figure_entry_is_well_formed() -> None:
    for figure in _figures():
        assert set(figure) == {"doc", "quote", "file", "values"}, figure
        assert figure["file"].startswith("loadtest/results/"), figure
        assert figure["values"], figure
        for value in figure["values"]:
            assert {"shown", "key"} <= set(value) <= {"shown", "key", "over", "scale"}, value


MEASURED_HEADER = re.compile(
    r"\b(?:p50|p90|p99|p99\.9|µs|ms|CPU|measured|rps|events/s|MB|size|per row)\b"
)
"""A table header that announces measurements (not settings or defaults)."""
NO_RESULTS_FILE = "no results file"
"""The words a section uses to say its measurements are kept in no results file."""


def _measurement_tables() -> Iterator[tuple[str, int, str]]:
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"(?:^\|.*\|\n){3,}", text, re.MULTILINE):
            header = match.group(0).splitlines()[0]
            if MEASURED_HEADER.search(header):
                yield _doc_id(doc), text[: match.start()].count("\n") + 1, header


@pytest.mark.parametrize(("doc", "line", "header"), list(_measurement_tables()))
def test_every_table_of_measurements_names_its_source(doc: str, line: int, header: str) -> None:
    text = (ROOT / doc).read_text()
    offset = sum(len(row) + 1 for row in text.split("\n")[: line - 1])
    section = _section(text, offset)
    assert (
        "loadtest/results/" in section
        or RESULT_NAME.search(section)
        or NO_RESULTS_FILE in section.lower()
    ), (
        f"{doc}:{line}: the table {header[:60]!r} quotes measurements, but its section names "
        f"no file of loadtest/results/ and does not say '{NO_RESULTS_FILE}'"
    )


FAILURES = ("container crash", "pod deletion", "node loss", "power loss")
"""The failures whose cost to the gateway's journal both Kubernetes docs state, row by row."""
FAILURE_TABLE = "| failure | kept | may be lost | held by |"
STATED_BOUND = "stated bound"


@pytest.mark.parametrize("doc", ["docs/kubernetes.md", "docs/reliability.md"])
def test_every_failure_in_a_pod_is_held_by_a_test_or_a_stated_bound(doc: str) -> None:
    lines = (ROOT / doc).read_text().splitlines()
    start = lines.index(FAILURE_TABLE)
    table = lines[start + 2 : start + 2 + len(FAILURES)]
    assert [r.split("|")[1].strip().split(" (")[0] for r in table] == list(FAILURES)
    for row in table:
        held_by = row.split("|")[4]
        named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", held_by)
        assert named or STATED_BOUND in held_by, f"{doc}: {row[:60]!r} is held by nothing"
        for path, test in named:
            source = (ROOT / path).read_text()
            assert f"def {test}(" in source, f"{doc}: {path} has no {test}"


# When and where: every quoted results file records its run, every quoting table shows it.


def _results_named(text: str) -> list[Path]:
    """The results files ``text`` names (by path or by name), in the order it names them."""
    tokens = [m.group(1).rstrip(".,;:") for m in re.finditer(r"loadtest/results/(\S+)", text)]
    tokens += [m.group(1) for m in RESULT_NAME.finditer(text)]
    found: list[Path] = []
    for token in tokens:
        name = _glob(token.strip("`()").split("/")[0])
        for path in sorted(RESULTS.glob(name)) if name else []:
            if path.is_file() and path not in found:
                found.append(path)
    return found


def _quoted_results() -> list[tuple[str, str]]:
    cases = {(_doc_id(doc), p.name) for doc in DOCS for p in _results_named(doc.read_text())}
    cases |= {(f["doc"], Path(f["file"]).name) for f in _figures()}
    return sorted(cases)


@pytest.mark.parametrize(("doc", "name"), _quoted_results())
def test_every_quoted_results_file_records_commit_date_and_machine(doc: str, name: str) -> None:
    path = RESULTS / name
    holder = provenance.carrier(path)
    record = provenance.read(holder) if holder.suffix in {".json", ".md"} else None
    assert record is not None, (
        f"{doc} quotes {name}, but {holder.name} records no provenance (a JSON 'provenance' "
        f"object or a Markdown first line '{provenance.PREFIX}commit …')"
    )
    assert re.fullmatch(r"[0-9a-f]{7,40}", record.commit), (
        f"{holder.name}: commit {record.commit!r}"
    )
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2} UTC)?", record.date), (
        f"{holder.name}: date {record.date!r}"
    )
    assert record.machine.strip() and record.command.strip(), f"{holder.name}: {record}"


SOURCE_LINE = re.compile(
    r"loadtest/results/([\w.-]+), commit ([0-9a-f]{7,40}), (\d{4}-\d{2}-\d{2})"
)
"""One source in the line under a table: the file, the commit and day of its run."""


def _quoting_tables() -> Iterator[tuple[str, int, str, list[str]]]:
    """Every table that quotes results: one holding a figure of ``docs/figures.toml``, one of
    measurements whose section names a results file, or one right after a paragraph that names
    one (a list of the files themselves, ``| file | …``, quotes nothing). Yields the doc, the
    table's line, the text after it and the files its figures come from."""
    figures = _figures()
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"(?:^\|.*\|\n){3,}", text, re.MULTILINE):
            table, header = match.group(0), match.group(0).splitlines()[0]
            section = _section(text, match.start())
            before = text[text.index(section) : match.start()].rstrip("\n").split("\n\n")[-1]
            quoted = [
                f["file"] for f in figures if f["doc"] == _doc_id(doc) and f["quote"] in table
            ]
            measured = MEASURED_HEADER.search(header) and _results_named(section)
            introduced = _results_named(before) and not header.startswith("| file ")
            if quoted or measured or introduced:
                line = text[: match.start()].count("\n") + 1
                yield _doc_id(doc), line, text[match.end() :], sorted(set(quoted))


@pytest.mark.parametrize(
    ("doc", "line", "after", "quoted"),
    list(_quoting_tables()),
    ids=[f"{doc}:{line}" for doc, line, _, _ in _quoting_tables()],
)
def test_every_table_quoting_a_results_file_shows_its_commit_and_date(
    doc: str, line: int, after: str, quoted: list[str]
) -> None:
    source = after.lstrip("\n").split("\n", 1)[0]
    assert source.startswith("From loadtest/results/"), (
        f"{doc}:{line}: the table quotes measurements; the line under it must say where they come "
        "from: 'From loadtest/results/<file>, commit <hash>, <YYYY-MM-DD>, <cores>.'"
    )
    named = SOURCE_LINE.findall(source)
    assert named, f"{doc}:{line}: {source!r} names no file with its commit and date"
    for name, commit, day in named:
        holder = provenance.carrier(RESULTS / name)
        record = provenance.read(holder) if holder.is_file() else None
        assert record is not None, f"{doc}:{line}: {name} records no provenance"
        assert (commit, day) == (record.commit, record.date[:10]), (
            f"{doc}:{line} says {name} is from commit {commit}, {day}; "
            f"{holder.name} records commit {record.commit}, {record.date}"
        )
    stems = {Path(name).stem for name, _, _ in named}
    for file in quoted:
        assert Path(file).stem in stems, (
            f"{doc}:{line} quotes {file}, but the line under it omits it"
        )


def _figures_commands() -> list[list[str]]:
    """The commands ``make figures`` runs (``make -n``: printed, not run), split as a shell would."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "figures"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [shlex.split(line) for line in out.replace("\\\n", " ").splitlines() if line.strip()]


def _written_by(command: list[str]) -> set[str]:
    """The results files (base names) one command writes: its ``--name``, or for
    ``loadtest.bench`` ``bench-<each of --only>``."""
    options = dict(zip(command, [*command[1:], ""], strict=True))
    if "--name" in options:
        return {options["--name"]}
    if "loadtest.bench" in command:
        return {f"bench-{b}" for b in options.get("--only", ",".join(BENCHES)).split(",")}
    return set()


def test_make_figures_reruns_every_results_file_the_readme_quotes() -> None:
    written = set().union(*(_written_by(c) for c in _figures_commands()))
    assert "make figures" in (ROOT / "README.md").read_text()
    readme = {
        provenance.carrier(RESULTS / name).stem
        for doc, name in _quoted_results()
        if doc == "README.md"
    }
    assert readme, "README.md quotes no results file"
    assert not readme - written, (
        f"README.md quotes {sorted(readme - written)}, which no command of `make figures` writes"
    )
