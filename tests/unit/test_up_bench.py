"""The default-against-default benchmark's arithmetic: medians per side and rate, and the
CPU ratio taken within each round (both sides of a round share the machine's state)."""

from __future__ import annotations

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
    }


def _runs() -> list[dict[str, Any]]:
    # A slow second round doubles both sides: the ratio within each round stays 0.5.
    return [
        {"round": 1, "side": "before", "processes": 15, "steps": [_step(100, 10.0, late=3)]},
        {"round": 1, "side": "after", "processes": 11, "steps": [_step(100, 5.0)]},
        {"round": 2, "side": "after", "processes": 11, "steps": [_step(100, 10.0, late=1)]},
        {"round": 2, "side": "before", "processes": 15, "steps": [_step(100, 20.0, late=9)]},
        {"round": 3, "side": "before", "processes": 15, "steps": [_step(100, 12.0)]},
        {"round": 3, "side": "after", "processes": 11, "steps": [_step(100, 6.0)]},
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


def test_the_report_shows_each_rounds_failures_and_the_median_ratio() -> None:
    result = {"before": "abc1234", "rounds": 3, "seconds": 20.0, "runs": _runs()}
    result.update(up_bench.summarize(_runs(), [100], rounds=3))
    text = up_bench.markdown(result)
    assert "Before: commit abc1234" in text
    assert "3 of 2000 / 9 of 2000 / 0 of 2000" in text
    assert "**0.50×**" in text
    assert "| 1/3 |" in text and "| 2/3 |" in text
