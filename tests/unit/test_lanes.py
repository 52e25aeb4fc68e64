"""make test's lanes: every module runs in exactly one, the time-judging ones alone."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import durations, lanes, run

pytest_plugins = ("pytester",)


def test_every_integration_module_is_in_exactly_one_lane() -> None:
    timing, rest, images = lanes.timing_modules(), lanes.rest_modules(), lanes.images_modules()
    assert all(path.exists() for path in timing + images), "a module that does not exist"
    assert not set(timing) & set(rest) and not set(images) & set(rest + timing)
    assert sorted(timing + rest + images) == lanes.integration_modules()
    assert len(set(timing)) == len(timing)


def test_every_module_that_counts_late_calls_is_in_the_timing_lane() -> None:
    # A module that judges a fault window (late calls against the run's baseline) or a load
    # step must not share a core's priority with the other lanes.
    judges = re.compile(
        r"faultwindow|loadtest\.(runner|crash|chaos|drive)|from loadtest import .*\b(hostile|runner)\b"
    )
    timing = set(lanes.timing_modules())
    for path in lanes.integration_modules():
        if judges.search(path.read_text()):
            assert path in timing, f"{path.name} judges time but runs in the rest lane"


def test_a_run_plans_three_lanes_side_by_side_then_the_timing_lane_alone() -> None:
    planned = {lane.name: lane for lane in run.plan(3, set(run.LANES))}
    assert set(planned) == {"tools", "timing", "rest", "static", "images"}
    assert planned["timing"].niceness == 0
    assert set(planned["timing"].after) == {"tools", "rest", "static", "images"}
    # The tools first, the image build beside them (it runs none of them); then the rest.
    assert planned["tools"].commands == [run.TOOLS] and planned["tools"].niceness == 0
    assert not planned["tools"].after and not planned["images"].after
    for name in ("rest", "static"):
        assert planned[name].after == ("tools",), name
    assert planned["rest"].niceness == 0
    assert planned["static"].niceness > 0 and planned["images"].niceness > 0
    rest_argv = planned["rest"].commands[0]
    assert rest_argv[rest_argv.index("-n") + 1] == "3"
    assert rest_argv[-1] == "tests/unit" and "tests/integration/test_images.py" not in rest_argv
    timing_argv = planned["timing"].commands[0]
    assert "-n" not in timing_argv
    assert [arg for arg in timing_argv if arg.startswith("tests/")] == [
        str(p.relative_to(run.REPO)) for p in lanes.timing_modules()
    ]
    static = [" ".join(argv) for argv in planned["static"].commands]
    assert any("check-gen" in c for c in static) and any("lint" in c for c in static)
    assert any("k8s-check" in c for c in static) and any("go test" in c for c in static)
    assert "tests/integration/test_images.py" in planned["images"].commands[0]


def test_one_worker_runs_the_rest_in_one_process() -> None:
    [tools, rest] = run.plan(1, {"rest"})
    assert "-n" not in rest.commands[0] and rest.after == ("tools",)
    assert tools.name == "tools"


def test_a_lane_that_runs_the_tools_builds_them_first_and_the_image_build_needs_none() -> None:
    for wanted in ("rest", "static", "timing"):
        planned = run.plan(2, {wanted})
        assert [lane.name for lane in planned] == ["tools", wanted], wanted
        assert planned[1].after == ("tools",), wanted
    [images] = run.plan(2, {"images"})
    assert images.name == "images" and not images.after


def test_the_durations_file_records_each_test_and_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(run.REPO))
    pytester.makeconftest("pytest_plugins = ('tests.durations',)")
    pytester.makepyfile(
        test_some="""
        import subprocess, sys, time
        def test_quick():
            pass
        def test_slow():
            time.sleep(0.2)
        def test_busy_child():
            code = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
            subprocess.run([sys.executable, "-c", code], check=True)
        def test_broken():
            assert False
        """
    )
    out = pytester.path / "durations.json"
    result = pytester.runpytest_subprocess(f"--durations-file={out}")
    result.assert_outcomes(passed=3, failed=1)
    document = json.loads(out.read_text())
    for key in ("commit", "date", "machine", "command"):
        assert document["provenance"][key], key
    assert "cores" in document["provenance"]["machine"]
    tests = document["durations"]
    assert tests["test_some.py::test_slow"]["call"] >= 0.2
    assert tests["test_some.py::test_broken"]["outcome"] == "failed"
    assert tests["test_some.py::test_quick"]["outcome"] == "passed"
    assert next(iter(tests)) == "test_some.py::test_busy_child"  # slowest first
    assert document["tests"] == 4
    assert document["modules"]["test_some.py"] >= 0.5
    # CPU: a child's counts once it has ended; a sleep's does not.
    assert tests["test_some.py::test_busy_child"]["cpu"] >= 0.3
    assert tests["test_some.py::test_slow"]["cpu"] < 0.15
    assert document["modules_cpu_s"]["test_some.py"] >= 0.3


def test_the_conditions_name_commit_date_machine_and_command() -> None:
    found = durations.conditions(["pytest", "x"])["provenance"]
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?|unknown", found["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", found["date"])
    assert found["command"] == "pytest x"
    assert "cores" in found["machine"]


def test_a_lane_starts_once_the_lanes_it_waits_for_have_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamps = tmp_path / "stamps"
    stamp = "import sys, time; open(sys.argv[1], 'a').write(f'{sys.argv[2]} {time.time()}\\n')"

    def lane(name: str, after: tuple[str, ...], seconds: float) -> run.Lane:
        argv = [sys.executable, "-c", f"{stamp}; time.sleep({seconds})", str(stamps)]
        return run.Lane(name, [[*argv, f"{name}-start"]], 0, None, after=after)

    monkeypatch.setattr(run, "LOGS", tmp_path / "logs")
    monkeypatch.setattr(run, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(
        run,
        "plan",
        lambda workers, wanted: [
            lane("timing", ("rest", "static"), 0.0),
            lane("rest", (), 3.0),
            lane("static", (), 0.2),
        ],
    )
    monkeypatch.setattr(
        run.Lane, "__post_init__", lambda self: setattr(self, "log", run.LOGS / f"{self.name}.log")
    )
    assert run.main([]) == 0
    started = {
        line.split()[0].removesuffix("-start"): float(line.split()[1])
        for line in stamps.read_text().splitlines()
    }
    assert started["timing"] >= started["rest"] + 3.0
    # Side by side: neither waited for the other's end (a start's own delay on a busy machine
    # is well under the 3 s that rest runs).
    assert abs(started["rest"] - started["static"]) < 3.0


def _go_sources() -> Iterator[Path]:
    """The repository's Go files, not walking into build/ (the image lane's root file system
    is there), virtual environments, node_modules or .git."""
    skipped = {"build", ".venv", "node_modules", ".git"}
    for folder, subfolders, files in os.walk(run.REPO):
        if Path(folder) == run.REPO:
            subfolders[:] = [d for d in subfolders if d not in skipped]
        yield from (
            Path(folder) / name for name in files if name.endswith(".go") or name == "go.mod"
        )


def test_the_go_checks_cover_every_package_of_the_root_module() -> None:
    makefile = (run.REPO / "Makefile").read_text()
    declared = re.search(r"^GO_PACKAGES := (.+)$", makefile, re.MULTILINE)
    assert declared is not None and tuple(declared.group(1).split()) == run.GO_PACKAGES
    roots = [run.REPO / pattern.removesuffix("/...") for pattern in run.GO_PACKAGES]
    found = list(_go_sources())
    other_modules = {p.parent for p in found if p.name == "go.mod" and p.parent != run.REPO}
    sources = [p for p in found if p.suffix == ".go"]
    assert sources
    for source in sources:
        if any(module in source.parents for module in other_modules):
            continue
        assert any(root in source.parents for root in roots), source.relative_to(run.REPO)


def test_a_fresh_clone_orders_the_modules_by_the_run_kept_in_the_repository(
    tmp_path: Path,
) -> None:
    # A module the kept run does not name may be a long one: it goes first, not last.
    unnamed = lanes.INTEGRATION / "test_not_in_the_kept_run.py"
    modules = [*lanes.rest_modules(), unnamed]
    kept = json.loads(run.COMMITTED_DURATIONS.read_text())["modules"]
    ordered = run._order_by_last_run(modules, last=tmp_path / "none.json")
    seconds = [kept.get(str(p.relative_to(run.REPO)), math.inf) for p in ordered]
    assert seconds == sorted(seconds, reverse=True)
    assert seconds[ordered.index(unnamed)] == math.inf
    last = tmp_path / "durations.json"
    last.write_text(json.dumps({"modules": {"tests/integration/test_mesh.py": 1e6}}))
    again = run._order_by_last_run(modules, last=last)
    named = [p for p in again if str(p.relative_to(run.REPO)) in kept]
    assert named[0] == lanes.INTEGRATION / "test_mesh.py"


def test_the_runs_file_merges_each_lanes_tests_seconds_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    monkeypatch.setattr(run, "LOGS", tmp_path)
    made = []
    for name, module, seconds, cpu in (
        ("rest", "a.py", 30.0, 12.5),
        ("timing", "b.py", 20.0, 18.0),
    ):
        path = tmp_path / f"durations-{name}.json"
        path.write_text(
            json.dumps(
                {
                    "tests": 1,
                    "workers": 3 if name == "rest" else 0,
                    "modules": {module: seconds},
                    "modules_cpu_s": {module: cpu},
                    "durations": {f"{module}::t": {"total": seconds, "cpu": cpu}},
                }
            )
        )
        lane = run.Lane(name, [["true"]], 0, path)
        lane.codes = [0]
        made.append(lane)
    merged = json.loads(run.merge_durations(made, 50.0).read_text())
    assert merged["modules"] == {"a.py": 30.0, "b.py": 20.0}
    assert merged["modules_cpu_s"] == {"a.py": 12.5, "b.py": 18.0}
    assert merged["lanes"]["rest"]["cpu_s"] == 12.5 and merged["lanes"]["timing"]["cpu_s"] == 18.0
    assert merged["durations"]["b.py::t"]["lane"] == "timing"
    assert merged["lanes"]["rest"]["workers"] == 3 and merged["lanes"]["timing"]["workers"] == 0
