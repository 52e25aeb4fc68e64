"""When, where and how a results file was measured: one record for every writer in loadtest/.

Every results file carries the same four fields: the commit measured, the date (UTC), the machine
(cores, CPU model, load average) and the command. JSON files hold them in a ``provenance`` object,
Markdown files in their first line, so a figure quoted from either can be traced to its run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The checkout whose commit a run records."""
PREFIX = "Provenance: "
"""How the first line of a Markdown results file starts."""
LINE = re.compile(
    r"^Provenance: commit (?P<commit>[0-9a-f]{7,40}), (?P<date>\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2} UTC)?); "
    r"machine: (?P<machine>[^;]+); command: `(?P<command>[^`]+)`\.$"
)
"""The first line of a Markdown results file, field by field."""


@dataclass(frozen=True)
class Provenance:
    """The conditions a results file was measured in."""

    commit: str
    """Short hash of the commit the measurement ran on."""
    date: str
    """``YYYY-MM-DD HH:MM UTC`` for new runs; ``YYYY-MM-DD`` where only the day is known."""
    machine: str
    """Cores, CPU model and load average, or what of them is known."""
    command: str
    """The command line that produced the file."""

    def line(self) -> str:
        """The record as the first line of a Markdown results file."""
        return (
            f"{PREFIX}commit {self.commit}, {self.date}; machine: {self.machine}; "
            f"command: `{self.command}`."
        )

    def as_json(self) -> dict[str, str]:
        """The record as a JSON ``provenance`` object."""
        return asdict(self)


def git_commit(checkout: Path = REPO_ROOT) -> str:
    """The short hash of ``checkout``'s HEAD (this one by default), or ``unknown`` outside a
    git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=checkout,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name from ``/proc/cpuinfo``, or ``CPU model unknown`` where it has none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "CPU model unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else "CPU model unknown"


def machine() -> str:
    """Cores, CPU model and the load average now (call it at the end of a run)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {cpu_model()}, load average {load} at the end"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that is running, as a user would type it (``python -m loadtest.x ...``)."""
    args = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if argv is None and spec is not None and spec.name:
        name = spec.name.removesuffix(".__main__")
        return " ".join([f"python -m {name}", *map(shlex.quote, args[1:])])
    if args and Path(args[0]).name == "fraudmesh":
        args[0] = "fraudmesh"
    return " ".join(shlex.quote(a) for a in args)


def naming_checkouts(command: str, named: Mapping[str, str]) -> str:
    """``command`` with each path typed in it (a key of ``named``) replaced by its name: an
    other checkout is recorded by its commit (``<checkout of 1a2b3c4>``), not by where it
    happened to be on the machine that ran it."""
    words = shlex.split(command)
    return " ".join(named.get(word, shlex.quote(word)) for word in words)


def other_checkout(path: Path) -> str:
    """How a results file names another checkout: by its commit."""
    return f"<checkout of {git_commit(path)}>"


def record(command: str | None = None, now: datetime | None = None) -> Provenance:
    """The provenance of a run ending now: this checkout's commit, the UTC time, this machine."""
    when = now or datetime.now(UTC)
    return Provenance(
        commit=git_commit(),
        date=f"{when:%Y-%m-%d %H:%M} UTC",
        machine=machine(),
        command=command or command_line(),
    )


def attach(data: Any, prov: Provenance) -> dict[str, Any]:
    """``data`` with the record first: a mapping gains ``provenance``, a list becomes ``rows``."""
    if isinstance(data, dict):
        rest = {k: v for k, v in data.items() if k != "provenance"}
        return {"provenance": prov.as_json(), **rest}
    return {"provenance": prov.as_json(), "rows": data}


def markdown(text: str, prov: Provenance) -> str:
    """``text`` with the record as its first line (replacing an older one)."""
    lines = text.split("\n")
    if lines and lines[0].startswith(PREFIX):
        lines = lines[2:] if len(lines) > 1 and not lines[1].strip() else lines[1:]
    return "\n".join([prov.line(), "", *lines])


def write(stem: Path, data: Any, text: str, prov: Provenance) -> tuple[Path, Path]:
    """Writes ``stem``.json and ``stem``.md, each carrying the record; returns both paths."""
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(attach(data, prov), indent=2, default=str) + "\n")
    md_path.write_text(markdown(text, prov).rstrip("\n") + "\n")
    return json_path, md_path


def read(path: Path) -> Provenance | None:
    """The record a results file carries (JSON ``provenance`` or the Markdown first line), if any."""
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
        found = data.get("provenance") if isinstance(data, dict) else None
        if not isinstance(found, dict) or set(found) != {"commit", "date", "machine", "command"}:
            return None
        return Provenance(**{k: str(v) for k, v in found.items()})
    match = LINE.match(text.split("\n", 1)[0])
    return Provenance(**match.groupdict()) if match else None


def carrier(path: Path) -> Path:
    """The file that holds ``path``'s record: itself for JSON and Markdown; for a plot or a
    profile, the Markdown (or JSON) of the same run (``scale.png`` → ``scale.md``,
    ``profile-gateway.txt`` → ``profile.md``)."""
    if path.suffix in {".json", ".md"}:
        return path
    stem = path.stem
    while True:
        for suffix in (".md", ".json"):
            candidate = path.with_name(stem + suffix)
            if candidate.is_file():
                return candidate
        if "-" not in stem:
            return path
        stem = stem.rsplit("-", 1)[0]
