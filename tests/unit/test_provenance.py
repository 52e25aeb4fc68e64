"""The provenance record every results file carries: built from this checkout and machine,
written into JSON and Markdown, and read back the same."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

from loadtest import provenance


def test_a_record_names_this_checkout_the_utc_time_and_the_machine() -> None:
    record = provenance.record(
        "python -m loadtest.x --rounds 3", datetime(2026, 11, 28, 9, 5, tzinfo=UTC)
    )
    assert re.fullmatch(r"[0-9a-f]{7,40}", record.commit)
    assert record.date == "2026-11-28 09:05 UTC"
    assert record.machine.startswith(f"{os.cpu_count()} cores, ")
    assert "load average" in record.machine
    assert record.command == "python -m loadtest.x --rounds 3"


def test_the_cpu_model_comes_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000 @ 3.00GHz\nflags\t: fpu\n")
    assert provenance.cpu_model(cpuinfo) == "Example CPU 9000 @ 3.00GHz"
    cpuinfo.write_text("processor\t: 0\n")
    assert provenance.cpu_model(cpuinfo) == "CPU model unknown"
    assert provenance.cpu_model(tmp_path / "absent") == "CPU model unknown"


def test_the_command_line_is_written_as_a_user_types_it() -> None:
    assert provenance.command_line(["/venv/bin/fraudmesh", "crash", "--out", "a b"]) == (
        "fraudmesh crash --out 'a b'"
    )


def test_written_files_read_back_the_same_record(tmp_path: Path) -> None:
    record = provenance.record("fraudmesh loadtest --store redis")
    json_path, md_path = provenance.write(
        tmp_path / "run", {"p99_ms": 7.03}, "# Title\n\nbody\n", record
    )
    data = json.loads(json_path.read_text())
    assert list(data) == ["provenance", "p99_ms"] and data["p99_ms"] == 7.03
    assert md_path.read_text().split("\n")[:3] == [record.line(), "", "# Title"]
    assert provenance.read(json_path) == record == provenance.read(md_path)


def test_a_list_is_kept_under_rows_and_an_older_record_is_replaced(tmp_path: Path) -> None:
    old = provenance.Provenance("abc1234", "2026-11-01", "2 cores", "python -m loadtest.x")
    new = provenance.Provenance(
        "def5678", "2026-11-28 10:00 UTC", "2 cores", "python -m loadtest.x"
    )
    assert provenance.attach([1, 2], new) == {"provenance": new.as_json(), "rows": [1, 2]}
    assert provenance.attach({"provenance": old.as_json(), "a": 1}, new)["provenance"] == (
        new.as_json()
    )
    text = provenance.markdown(provenance.markdown("body\n", old), new)
    assert text == f"{new.line()}\n\nbody\n"


def test_a_file_without_a_record_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"machine": "2 CPUs", "command": "x"}')
    (tmp_path / "b.json").write_text("[1, 2]")
    (tmp_path / "c.md").write_text("# Title\n\nRun 2026-11-23 23:17 UTC; 2 CPUs.\n")
    assert all(provenance.read(tmp_path / n) is None for n in ("a.json", "b.json", "c.md"))


def test_a_plot_or_a_profile_is_vouched_for_by_the_report_of_its_run(tmp_path: Path) -> None:
    for name in ("scale.md", "scale.png", "profile.md", "profile-gateway.txt", "lone.png"):
        (tmp_path / name).write_text("")
    assert provenance.carrier(tmp_path / "scale.png") == tmp_path / "scale.md"
    assert provenance.carrier(tmp_path / "profile-gateway.txt") == tmp_path / "profile.md"
    assert provenance.carrier(tmp_path / "lone.png") == tmp_path / "lone.png"


def test_every_writer_of_results_files_stamps_its_record() -> None:
    # A module that writes into loadtest/results/ must build the record there, so a new
    # writer without one fails here rather than in the docs' checks months later.
    folder = Path(provenance.__file__).parent
    writers = [
        source
        for source in sorted(folder.glob("*.py"))
        if re.search(r"RESULTS|loadtest/results", source.read_text())
        and re.search(r"write_text\(|provenance\.write\(", source.read_text())
    ]
    assert len(writers) >= 10, [w.name for w in writers]
    for source in writers:
        assert "provenance.record(" in source.read_text(), (
            f"{source.name} writes results files without a provenance record"
        )
