"""``make test``: every check, in lanes in two phases (``tests/lanes.py`` says which and why).

Each lane writes its output to ``build/test-logs/<lane>.log`` and, for pytest, every test's
durations to ``build/test-results/durations-<lane>.json`` (``tests/durations.py``); the run
merges them into ``build/test-results/durations.json``. A lane's output is printed whole
when it ends, so lanes never interleave; the last line counts the tests of every lane.

    python -m tests.run [--workers N] [--lane tools|timing|rest|static|images ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests import lanes
from tests.durations import conditions

REPO = lanes.TESTS.parent
LOGS = REPO / "build" / "test-logs"
RESULTS = REPO / "build" / "test-results"
COMMITTED_DURATIONS = REPO / "loadtest" / "results" / "test-durations-order.json"
"""A whole run's durations, kept in the repository: where a CI run's time goes, and the order
the rest lane hands its modules out in a fresh clone (a CI run of 2 December from a fresh
clone, whose first phase ran the unit tests in a lane of their own)."""
BACKGROUND_NICENESS = 10
"""Niceness of the ``static`` and ``images`` lanes beside ``rest``: a nice-10 process gets
about a tenth of a core that a nice-0 one wants as well."""
DEFAULT_WORKERS = 2
"""pytest-xdist workers of the ``rest`` lane unless ``TEST_WORKERS`` says otherwise. Three
took the rest lane from 695 s to 630-635 s on two cores once the image's dependencies were
kept, but they saturated the cores to its end, and one of three such runs failed a
test_fallbacks call on Envoy's 50 ms cap; with bytecode compiled at install, two take it to
under 500 s without saturating them (docs/performance.md, "What a start costs")."""
GO_PACKAGES = ("./clients/...", "./gen/...")
"""The root Go module's packages (the Makefile's ``GO_PACKAGES``, which ``go vet`` checks).
Not ``./...``: that walks ``build/`` too, where check-gen leaves its copy of the stubs and
the image lane's root file system has ``/proc`` mounted while it runs; go fails on proc's
unreadable entries."""
STATIC: tuple[tuple[str, list[str]], ...] = (
    ("check-gen", ["make", "--no-print-directory", "check-gen"]),
    ("lint", ["make", "--no-print-directory", "lint"]),
    ("k8s-check", ["make", "--no-print-directory", "k8s-check"]),
    ("go-test", ["go", "test", *GO_PACKAGES]),
)
"""The checks that are not pytest, run one after another in the ``static`` lane."""


TOOLS = ["bash", "scripts/tools.sh"]
"""The pinned Go tools, buf and the trace collector (``make tools``; a no-op once installed).
From empty Go caches they take about 345 s of wall time and 600 s of CPU (173 % of two
cores), almost all of it compiling: the ``tools`` lane builds them first, and every lane but
``images``, whose image build needs none of them, waits for it. The image build's downloads
and its data preparation then overlap the compiles instead of the rest lane's tests."""

LANES = ("tools", "rest", "static", "images", "timing")
"""Every lane, in the order the plan lists them."""
NEEDS_TOOLS = frozenset({"rest", "static", "timing"})
"""The lanes that run the Go tools (ghz, grpcurl, otelcol-fraudmesh, the protoc plugins, the
manifest checkers): a run of any of them builds the tools first, in the ``tools`` lane."""


@dataclass
class Lane:
    """One lane: commands run one after another in a process tree of their own."""

    name: str
    commands: list[list[str]]
    niceness: int
    durations: Path | None = None
    after: tuple[str, ...] = ()
    """Lanes that must have ended before this one starts."""
    log: Path = field(init=False)
    began: float = 0.0
    ended: float | None = None
    codes: list[int] = field(default_factory=list)
    _process: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None
    _next: int = 0

    def __post_init__(self) -> None:
        self.log = LOGS / f"{self.name}.log"

    def start(self, env: dict[str, str]) -> None:
        """Starts the lane's first command."""
        self.began = time.monotonic()
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed when the lane ends
        self._env = env
        self._start_next()

    def _start_next(self) -> None:
        assert self._out is not None
        argv = self.commands[self._next]
        self._out.write(f"$ {' '.join(argv)}\n".encode())
        self._out.flush()
        self._process = subprocess.Popen(
            ["nice", "-n", str(self.niceness), *argv],
            cwd=REPO,
            env=self._env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._next += 1

    def poll(self) -> bool:
        """True once every command has ended (the next starts when one ends)."""
        if self.ended is not None:
            return True
        assert self._process is not None
        code = self._process.poll()
        if code is None:
            return False
        self.codes.append(code)
        if self._next < len(self.commands):
            self._start_next()
            return False
        self.ended = time.monotonic()
        assert self._out is not None
        self._out.close()
        return True

    def stop(self) -> None:
        """Ends what runs now (an interrupted run)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    @property
    def ok(self) -> bool:
        """Every command exited 0."""
        return bool(self.codes) and all(code == 0 for code in self.codes)

    @property
    def seconds(self) -> float:
        """How long the lane ran."""
        return (self.ended or time.monotonic()) - self.began


def _order_by_last_run(
    modules: list[Path], last: Path = RESULTS / "durations.json", kept: Path = COMMITTED_DURATIONS
) -> list[Path]:
    """Longest first by the last run's durations (for a module it did not run, as in a fresh
    clone, which has none, the run kept in the repository): pytest-xdist hands out modules in
    the order given, and a long one started last ends the run late. A module neither names
    goes first, for the same reason: it may be a long one (two modules of about a minute each
    that the kept run did not name ran last in fresh clones until 2 December)."""
    known: dict[str, float] = {}
    for source in (kept, last):  # the last run's seconds over the kept run's
        try:
            known |= json.loads(source.read_text()).get("modules", {})
        except (OSError, ValueError):
            continue
    return sorted(modules, key=lambda p: -known.get(str(p.relative_to(REPO)), math.inf))


def _pytest(name: str, targets: list[Path], extra: list[str]) -> tuple[list[str], Path]:
    durations = RESULTS / f"durations-{name}.json"
    argv = [
        sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider",
        f"--durations-file={_shown(durations)}", *extra,
        *[str(t.relative_to(REPO)) for t in targets],
    ]  # fmt: skip
    return argv, durations


def plan(workers: int, wanted: set[str]) -> list[Lane]:
    """The lanes of a run: ``tools`` beside ``images``; ``rest`` and ``static`` once the tools
    are built, ``images`` still beside them; then ``timing`` alone."""
    lanes_: list[Lane] = []
    tools: tuple[str, ...] = ()
    if "tools" in wanted or wanted & NEEDS_TOOLS:
        lanes_.append(Lane("tools", [TOOLS], 0))
        tools = ("tools",)
    if "rest" in wanted:
        # The unit tests last: many short modules even out the workers' ends.
        targets = [*_order_by_last_run(lanes.rest_modules()), lanes.TESTS / "unit"]
        xdist = ["-n", str(workers), "--dist", "loadfile"] if workers > 1 else []
        argv, durations = _pytest("rest", targets, xdist)
        lanes_.append(Lane("rest", [argv], 0, durations, after=tools))
    if "static" in wanted:
        static = [argv for _, argv in STATIC]
        lanes_.append(Lane("static", static, BACKGROUND_NICENESS, after=tools))
    if "images" in wanted:
        argv, durations = _pytest("images", lanes.images_modules(), [])
        lanes_.append(Lane("images", [argv], BACKGROUND_NICENESS, durations))
    if "timing" in wanted:
        argv, durations = _pytest("timing", lanes.timing_modules(), [])
        before = tuple(lane.name for lane in lanes_)
        lanes_.append(Lane("timing", [argv], 0, durations, after=before))
    return lanes_


def _counts(lanes_: list[Lane]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for lane in lanes_:
        if lane.durations is None or not lane.durations.exists():
            continue
        for record in json.loads(lane.durations.read_text())["durations"].values():
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    return counts


def merge_durations(lanes_: list[Lane], wall_s: float) -> Path:
    """One results file for the run: every lane's tests, modules and seconds."""
    merged: dict[str, object] = conditions(["python", "-m", "tests.run", *sys.argv[1:]]) | {
        "wall_s": round(wall_s, 1),
        "lanes": {},
    }
    modules: dict[str, float] = {}
    module_cpu: dict[str, float] = {}
    tests: dict[str, object] = {}
    for lane in lanes_:
        entry: dict[str, object] = {"seconds": round(lane.seconds, 1), "exit_codes": lane.codes}
        if lane.durations is not None and lane.durations.exists():
            document = json.loads(lane.durations.read_text())
            entry["tests"] = document["tests"]
            entry["workers"] = document.get("workers", 0)
            cpu = document.get("modules_cpu_s", {})
            entry["cpu_s"] = round(sum(cpu.values()), 1)
            module_cpu.update(cpu)
            for module, seconds in document["modules"].items():
                modules[module] = seconds
            for nodeid, record in document["durations"].items():
                tests[nodeid] = record | {"lane": lane.name}
        merged["lanes"][lane.name] = entry  # type: ignore[index]
    merged["modules"] = dict(sorted(modules.items(), key=lambda kv: -kv[1]))
    merged["modules_cpu_s"] = {module: module_cpu.get(module, 0.0) for module in merged["modules"]}
    merged["durations"] = tests
    target = RESULTS / "durations.json"
    target.write_text(json.dumps(merged, indent=1) + "\n")
    return target


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it is inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _report(lane: Lane) -> None:
    """Prints a lane's verdict and its whole output."""
    verdict = "passed" if lane.ok else f"FAILED (exit codes {lane.codes})"
    print(f"\n===== lane {lane.name} {verdict} in {lane.seconds:.0f} s =====", flush=True)
    sys.stdout.write(lane.log.read_text(errors="replace"))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Runs the lanes; exit status 0 only when every command of every lane passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workers = int(os.environ.get("TEST_WORKERS", DEFAULT_WORKERS))
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--lane", action="append", choices=LANES)
    args = parser.parse_args(argv)
    LOGS.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    shared = Path(tempfile.mkdtemp(prefix="fraudmesh-tests-"))
    env = {**os.environ, "FRAUD_TEST_SHARED_DIR": str(shared)}
    todo = plan(args.workers, set(args.lane or LANES))
    names = {lane.name for lane in todo}
    began = time.monotonic()
    try:
        waiting, running, ended = list(todo), list[Lane](), set[str]()
        while waiting or running:
            for lane in [w for w in waiting if not (set(w.after) & names) - ended]:
                waiting.remove(lane)
                running.append(lane)
                lane.start(env)
                print(f"lane {lane.name} started: {_shown(lane.log)}", flush=True)
            time.sleep(1.0)
            for lane in [lane for lane in running if lane.poll()]:
                running.remove(lane)
                ended.add(lane.name)
                _report(lane)
    except KeyboardInterrupt:
        for lane in todo:
            lane.stop()
        raise
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    wall = time.monotonic() - began
    results = merge_durations(todo, wall)
    print(f"\ndurations of every test: {_shown(results)}")
    for lane in todo:
        print(f"  lane {lane.name}: {'passed' if lane.ok else 'FAILED'} in {lane.seconds:.0f} s")
    print(f"  all lanes: {wall:.0f} s")
    counts = _counts(todo)
    failed = counts["failed"] + counts["error"]
    ok = all(lane.ok for lane in todo)
    print(f"tests: {counts['passed']} passed, {failed} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
