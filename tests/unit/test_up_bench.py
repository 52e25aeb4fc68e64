"""The default-against-default benchmark's arithmetic: medians per side and rate, and the
CPU ratio taken within each round (both sides of a round share the machine's state)."""

from __future__ import annotations

import math
from typing import Any

from loadtest import up_bench


def _step(rps: int, cpu: float, late: int = 0, calls: int = 2000) -> dict[str, Any]:
    return {
        "rps": rps,
        "calls": calls,
        "cpu_ms_per_score": cpu,
        "p50_ms": 5.0,
        "p99_ms": 20.0,
        "failed_or_late": late,
        "failed_or_late_share": late / calls,
        "degraded_shares": {
            "feature_source=default": 0.02 if late else 0.0,
            "feature_source=partial": 0.1,
            "scored_by=rules": 0.0,
            "scored_by=small_model": 0.0,
        },
        "full_quality": not late,
        "errors": {"DeadlineExceeded": late} if late else {},
        "refused": 0,
        "refusal_p99_ms": math.nan,
        "accepted_late_share": late / calls,
        "goodput_rps": (calls - late) / 20,
    }


def _run(index: int, side: str, step: dict[str, Any]) -> dict[str, Any]:
    processes, settled = (15, 12.0) if side == "before" else (11, 20.0)
    return {
        "round": index,
        "side": side,
        "processes": processes,
        "settled_s": settled,
        "steps": [step],
    }


def _runs() -> list[dict[str, Any]]:
    # A slow second round doubles both sides: the ratio within each round stays 0.5.
    return [
        _run(1, "before", _step(100, 10.0, late=3)),
        _run(1, "after", _step(100, 5.0)),
        _run(2, "after", _step(100, 10.0, late=1)),
        _run(2, "before", _step(100, 20.0, late=9)),
        _run(3, "before", _step(100, 12.0)),
        _run(3, "after", _step(100, 6.0)),
    ]


def test_the_ratio_is_taken_round_by_round_and_the_medians_per_side() -> None:
    result = up_bench.summarize(_runs(), [100], rounds=3)
    row = result["summary"]["100"]
    assert row["cpu_ratio_per_round"] == [0.5, 0.5, 0.5]
    assert row["cpu_ratio_median"] == 0.5
    assert row["before"]["cpu_ms_per_score"] == 12.0
    assert row["after"]["cpu_ms_per_score"] == 6.0
    assert row["before"]["failed_or_late_per_round"] == [3, 9, 0]
    assert row["before"]["full_quality_rounds"] == 1
    assert row["after"]["full_quality_rounds"] == 2
    assert row["before"]["feature_source=default"] == 0.02
    assert result["processes"] == {"before": 15, "after": 11}
    assert result["settled_s"] == {"before": 12.0, "after": 20.0}


def test_the_report_shows_each_rounds_failures_and_the_median_ratio() -> None:
    result = {
        "before": "abc1234",
        "rounds": 3,
        "seconds": 20.0,
        "settle": 10.0,
        "quiet": 0.25,
        "runs": _runs(),
    }
    result.update(up_bench.summarize(_runs(), [100], rounds=3))
    text = up_bench.markdown(result)
    assert "Before: commit abc1234" in text
    assert "median before 12 s, after 20 s" in text
    assert "3 of 2000 / 9 of 2000 / 0 of 2000" in text
    assert "**0.50×**" in text
    assert "| 1/3 |" in text and "| 2/3 |" in text


class _Tree:
    """A process tree busy at ``cores(t)`` cores at time t, on a fake clock."""

    def __init__(self, cores: Any) -> None:
        self.cores = cores
        self.now = 0.0
        self.cpu = 0.0

    def sleep(self, seconds: float) -> None:
        self.cpu += self.cores(self.now) * seconds
        self.now += seconds


def _fake(monkeypatch: Any, tree: _Tree) -> None:
    monkeypatch.setattr(up_bench.time, "sleep", tree.sleep)
    monkeypatch.setattr(up_bench.time, "monotonic", lambda: tree.now)
    monkeypatch.setattr(up_bench, "_tree_cpu", lambda _: tree.cpu)


def test_settling_waits_the_least_then_until_the_tree_is_quiet(monkeypatch: Any) -> None:
    # Busy until 14 s: after the least 10 s, the windows 10-12 and 12-14 are busy, 14-16 quiet.
    tree = _Tree(lambda t: 0.9 if t < 14 else 0.1)
    _fake(monkeypatch, tree)
    assert up_bench._settle(tree, 10.0, 0.25) == 16.0


def test_a_quiet_tree_is_measured_after_the_least_wait_and_one_window(monkeypatch: Any) -> None:
    tree = _Tree(lambda t: 0.1)
    _fake(monkeypatch, tree)
    assert up_bench._settle(tree, 10.0, 0.25) == 12.0


def test_settling_gives_up_after_a_minute(monkeypatch: Any) -> None:
    tree = _Tree(lambda t: 1.0)
    _fake(monkeypatch, tree)
    assert up_bench._settle(tree, 10.0, 0.25) == 60.0


def test_refusals_are_reported_apart_from_the_calls_let_in() -> None:
    refusing = {
        **_step(900, 3.0, late=600, calls=18000),
        "errors": {"ResourceExhausted": 594, "DeadlineExceeded": 6},
        "refused": 594,
        "refusal_p99_ms": 1.5,
        "accepted_late_share": 6 / 17406,
        "goodput_rps": 870.0,
    }
    timing_out = {**_step(900, 4.0, late=900, calls=18000), "goodput_rps": 855.0}
    runs = [_run(1, "before", timing_out), _run(1, "after", refusing)]
    result: dict[str, Any] = {
        "before": "abc1234",
        "rounds": 1,
        "seconds": 20.0,
        "settle": 10.0,
        "quiet": 0.25,
        "runs": runs,
    }
    result.update(up_bench.summarize(runs, [900], rounds=1))
    after = result["summary"]["900"]["after"]
    assert after["refused"] == 594 and after["refusal_p99_ms"] == 1.5
    assert after["timed_out_per_round"] == [6]
    assert result["summary"]["900"]["before"]["timed_out_per_round"] == [900]
    text = up_bench.markdown(result)
    assert "| 900 | after | 594 | 1.50 | 0.0% | 870.0 | 6 |" in text
    assert "| 900 | before | 0 | – | 5.0% | 855.0 | 900 |" in text


def test_each_process_cpu_per_score_is_a_median_over_the_rounds_in_its_own_table() -> None:
    runs = _runs()
    by_round = [
        {"gateway": 3.0, "updater": 1.0},
        {"gateway": 2.0, "updater": 0.5, "envoy": 0.4},
        {"gateway": 4.0, "updater": 2.0},
        {"gateway": 8.0, "updater": 4.0, "envoy": 0.9},
        {"gateway": 5.0, "updater": 1.5},
        {"gateway": 3.0, "updater": 0.7, "envoy": 0.5},
    ]
    for run, by in zip(runs, by_round, strict=True):
        run["steps"][0]["cpu_ms_per_score_by_process"] = by
    result = {"before": "abc1234", "rounds": 3, "seconds": 20.0, "settle": 10.0, "quiet": 0.25}
    result.update(up_bench.summarize(runs, [100], rounds=3))
    row = result["summary"]["100"]
    # Before: rounds 1, 2 and 3 are runs 0, 3 and 4; a process a round did not run counts 0.
    assert row["before"]["cpu_ms_per_score_by_process"] == {
        "envoy": 0.0, "gateway": 5.0, "updater": 1.5,
    }  # fmt: skip
    assert row["after"]["cpu_ms_per_score_by_process"] == {
        "envoy": 0.4, "gateway": 3.0, "updater": 0.7,
    }  # fmt: skip
    text = up_bench.markdown(result)
    assert "## CPU per Score by process" in text
    assert "| offered rps | side | gateway | updater | envoy |" in text
    assert "| 100 | before | 5.00 | 1.50 | 0.00 |" in text
    assert "| 100 | after | 3.00 | 0.70 | 0.40 |" in text


def test_a_report_without_figures_by_process_has_no_such_table() -> None:
    result = {"before": "abc1234", "rounds": 3, "seconds": 20.0, "settle": 10.0, "quiet": 0.25}
    result.update(up_bench.summarize(_runs(), [100], rounds=3))
    assert "by process" not in up_bench.markdown(result)
