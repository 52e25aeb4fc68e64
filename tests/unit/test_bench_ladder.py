"""The side-by-side benchmarks' rate ladder (on past the listed rates until a side misses its
criterion, within a rate and a time bound) and the request feast serve is sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import pytest

from loadtest import bench, report
from loadtest.ghz import Result
from services.featurestore import admin as store_admin
from services.featurestore import layout
from services.featurestore.repo import definitions


def _result(rps: float, p99: float, *, errors: int = 0, achieved: float | None = None) -> Result:
    count = 1000
    statuses = {"OK": count - errors} | ({"DeadlineExceeded": errors} if errors else {})
    return Result(
        offered_rps=rps,
        achieved_rps=rps if achieved is None else achieved,
        count=count,
        duration_s=count / rps,
        p50_ms=p99 / 3,
        p90_ms=p99 / 2,
        p99_ms=p99,
        p999_ms=p99 * 1.5,
        max_ms=p99 * 2,
        mean_ms=p99 / 3,
        status_counts=statuses,
    )


class FakeSide:
    """A side whose p99 at each rate comes from ``p99_at``; records the calls made."""

    def __init__(self, p99_at: Callable[[int], float], collapse_at: float = float("inf")):
        self.p99_at = p99_at
        self.collapse_at = collapse_at
        self.calls: list[tuple[list[int], bool]] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def run(self, rates: Sequence[int], warm: bool) -> list[report.Step]:
        self.calls.append((list(rates), warm))
        steps: list[report.Step] = []
        bad = 0
        for rps in rates:
            self.now += 10.0
            errors = 500 if rps >= self.collapse_at else 0
            steps.append(report.Step(_result(rps, self.p99_at(rps), errors=errors)))
            bad = bad + 1 if errors else 0
            if bad >= 2:
                break
        return steps


def _collapsed(result: Result) -> bool:
    return result.error_share > 0.2


def _climb(side: FakeSide, ladder: bench.Ladder) -> tuple[list[float], str]:
    steps, stop = bench.climb(
        ladder, side.run, _collapsed, step_s=10.0, clock=side.clock, log=lambda _: None
    )
    return [s.result.offered_rps for s in steps], stop


def test_the_ladder_goes_on_past_the_listed_rates_until_the_side_misses_twice() -> None:
    side = FakeSide(lambda rps: 2.0 if rps <= 2000 else 50.0)
    rates, stop = _climb(side, bench.Ladder((500, 1000), 10.0))
    # 1000 × 1.25 → 1250, 1600 (1562.5 rounded up to 50), 2000, then two misses.
    assert rates == [500, 1000, 1250, 1600, 2000, 2500, 3150]
    assert stop.startswith("missed")
    assert side.calls[0] == ([500, 1000], True)
    assert all(not warm for _, warm in side.calls[1:])


def test_a_side_that_misses_at_the_listed_rates_runs_them_all_for_the_fixed_comparisons() -> None:
    side = FakeSide(lambda rps: 50.0)
    rates, stop = _climb(side, bench.Ladder((50, 100, 500), 10.0))
    assert rates == [50, 100, 500]
    assert stop.startswith("missed")


def test_one_miss_then_a_pass_keeps_climbing() -> None:
    side = FakeSide(lambda rps: 50.0 if rps == 1250 else (2.0 if rps < 2000 else 50.0))
    rates, _ = _climb(side, bench.Ladder((1000,), 10.0))
    assert rates == [1000, 1250, 1600, 2000, 2500]


def test_a_collapsed_side_stops_at_once() -> None:
    side = FakeSide(lambda rps: 2.0, collapse_at=750)
    rates, stop = _climb(side, bench.Ladder((250, 500, 750, 1000, 1500), 10.0))
    assert rates == [250, 500, 750, 1000]
    assert stop.startswith("collapsed")


def test_the_rate_bound_stops_a_side_that_still_holds_and_says_at_least() -> None:
    side = FakeSide(lambda rps: 2.0)
    ladder = bench.Ladder((500, 1000, 5000), 10.0, max_rps=1500)
    steps, stop = bench.climb(
        ladder, side.run, _collapsed, step_s=10.0, clock=side.clock, log=lambda _: None
    )
    assert [s.result.offered_rps for s in steps] == [500, 1000, 1250, 1500]
    assert stop.startswith("rate bound")
    held = bench.Side("ours", steps, ladder, stop)
    assert held.bounded
    assert bench._best("ours", held) == "ours at least 1500 rps"


def test_the_time_bound_stops_the_climb() -> None:
    side = FakeSide(lambda rps: 2.0)
    rates, stop = _climb(side, bench.Ladder((100, 200), 10.0, max_s=45.0))
    # 2 listed steps (20 s), 250 (30 s), 350 (40 s); a fifth would end past 45 s.
    assert rates == [100, 200, 250, 350]
    assert stop.startswith("time bound")


def test_a_step_the_load_generator_could_not_send_does_not_hold() -> None:
    ladder = bench.Ladder((100,), 10.0)
    assert ladder.holds(_result(1000, 2.0))
    assert not ladder.holds(_result(1000, 2.0, achieved=900))
    assert not ladder.holds(_result(1000, 2.0, errors=1))
    assert not ladder.holds(_result(1000, 10.5))
    side = bench.Side(
        "s",
        [report.Step(_result(1000, 2.0)), report.Step(_result(1250, 2.0, achieved=900))],
        ladder,
        "missed",
    )
    best = side.best()
    assert best is not None and best.offered_rps == 1000
    assert not side.bounded


def test_the_bound_note_says_which_way_a_ratio_is_limited() -> None:
    held = bench.Side(
        "a", [report.Step(_result(100, 2.0))], bench.Ladder((100,), 10.0), "rate bound"
    )
    missed = bench.Side("b", [report.Step(_result(100, 2.0))], bench.Ladder((100,), 10.0), "missed")
    assert "at least" in bench._bound_note(held, missed)
    assert "at most" in bench._bound_note(missed, held)
    assert bench._bound_note(missed, missed) == ""


def _service_join_keys() -> set[str]:
    views = {p.name for p in definitions.fraud_scoring.feature_view_projections}
    entity_names = {
        name
        for obj in store_admin.OBJECTS
        if getattr(obj, "name", None) in views and hasattr(obj, "entities")
        for name in obj.entities
    }
    return {
        obj.join_key
        for obj in store_admin.OBJECTS
        if hasattr(obj, "join_key") and obj.name in entity_names
    }


def test_feast_serve_is_sent_every_join_key_of_the_feature_service(tmp_path: Path) -> None:
    pd.DataFrame(
        {
            "timestamp": pd.to_datetime(
                ["2026-01-01T10:00Z", "2026-01-02T10:00Z", "2026-01-03T10:00Z"], utc=True
            ),
            "card_id": ["card-1", "card-2", "card-3"],
            "merchant_id": ["merch-00001", "merch-00002", "merch-00003"],
            "terminal_id": ["merch-00001-t1", "merch-00002-t1", ""],
            "is_fraud": [False, False, False],
        }
    ).to_parquet(tmp_path / layout.TRANSACTIONS_FILE)
    entities = bench.known_entities(tmp_path)
    # The latest genuine payment that names a terminal.
    assert entities == {
        "card_id": "card-2",
        "merchant_id": "merch-00002",
        "terminal_id": "merch-00002-t1",
    }
    body = json.loads(bench.feast_request(entities))
    assert body["feature_service"] == definitions.FEATURE_SERVICE
    assert set(body["entities"]) == _service_join_keys()
    assert body["entities"]["terminal_id"] == ["merch-00002-t1"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--rates", "100,50"],
        ["--rates", "0,100"],
        ["--rates", "a,b"],
        ["--max-rps", "0"],
        ["--max-side-seconds", "-1"],
        ["--step-seconds", "x"],
        ["--only", "nope"],
    ],
)
def test_bad_options_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
