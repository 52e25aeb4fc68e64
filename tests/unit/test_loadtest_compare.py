"""The load-test report's degraded shares and plot, and the side-by-side comparison's logic:
variant syntax and checks, rotation, medians, ratios, full quality, report files."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loadtest import compare, report, runner
from loadtest.ghz import Result


def _result(rps: float, p99: float, errors: int = 0, count: int = 1000) -> Result:
    statuses = {"OK": count - errors} | ({"DeadlineExceeded": errors} if errors else {})
    return Result(
        offered_rps=rps,
        achieved_rps=rps,
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


def _step(
    rps: float,
    p99: float,
    *,
    default: float = 0.0,
    partial: float = 0.0,
    rules: float = 0.0,
    small: float = 0.0,
    first: float = 0.0,
    cpu: float = 3.0,
    errors: int = 0,
) -> report.Step:
    answers = {
        "scored_by=model": 1000 * (1 - rules - small - first),
        "scored_by=rules": 1000 * rules,
        "scored_by=small_model": 1000 * small,
        "scored_by=first_stage": 1000 * first,
        "feature_source=online": 1000 * (1 - default - partial),
        "feature_source=default": 1000 * default,
        "feature_source=partial": 1000 * partial,
    }
    return report.Step(
        _result(rps, p99, errors),
        {"gateway": 100 * 2**20},
        {"gateway": cpu * 0.5, "features": cpu * 0.3, "updater": cpu * 0.2},
        answers,
    )


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


# --- the report's degraded shares ---------------------------------------------------------


def test_step_shares_name_each_kind_of_degraded_answer() -> None:
    step = _step(400, 8.0, default=0.1, partial=0.05, rules=0.02, small=0.03, first=0.8)
    assert step.shares() == pytest.approx(
        {
            "feature_source=default": 0.1,
            "feature_source=partial": 0.05,
            "scored_by=rules": 0.02,
            "scored_by=small_model": 0.03,
        }
    )
    assert step.share("scored_by=first_stage") == pytest.approx(0.8)
    assert report.Step(_result(400, 8.0)).shares() == {}


@pytest.mark.parametrize(
    ("step", "full"),
    [
        (_step(400, 8.0), True),
        (_step(400, 8.0, partial=0.5), True),
        (_step(400, 8.0, default=0.05), False),
        (_step(400, 8.0, rules=0.01), False),
        (_step(400, 8.0, small=0.01), False),
        (_step(400, 8.0, first=0.9), True),
        (_step(400, 43.0), False),
        (_step(400, 8.0, errors=1), False),
        (report.Step(_result(400, 8.0)), False),
    ],
    ids=[
        "clean",
        "partial-is-fine",
        "default",
        "rules",
        "small-model-fallback",
        "first-stage-is-full",
        "late",
        "error",
        "unknown",
    ],
)
def test_full_quality_needs_no_errors_p99_in_budget_and_few_degraded(
    step: report.Step, full: bool
) -> None:
    assert step.full_quality() is full


def test_max_full_quality_is_the_highest_full_step_even_after_a_bad_one() -> None:
    steps = [_step(200, 5.0), _step(400, 9.0, default=0.3), _step(500, 12.0), _step(600, 50.0)]
    best = report.max_full_quality(steps)
    assert best is not None and best.result.offered_rps == 500
    assert report.max_full_quality([_step(200, 5.0, rules=0.2)]) is None


def test_steps_table_shows_rules_small_model_default_partial_and_first_stage_shares() -> None:
    step = _step(200, 5.0, default=0.125, partial=0.25, rules=0.5, small=0.1, first=0.3)
    head, _, row = report.steps_table([step]).splitlines()
    assert "| by rules | by small model | default features | partial features | first stage |" in (
        head
    )
    assert "| 50.0% | 10.0% | 12.5% | 25.0% | 30.0% |" in row
    assert "default features" not in report.steps_table([report.Step(_result(200, 5.0))])


def test_plot_adds_the_degraded_panel_only_when_answers_are_known(tmp_path: Path) -> None:
    plain = report.plot({"a": [_result(100, 4.0), _result(200, 6.0)]}, tmp_path / "a.png", "t")
    steps = [_step(100, 4.0), _step(200, 6.0, default=0.4, rules=0.1, errors=3)]
    shared = report.plot({"a": steps, "b": steps}, tmp_path / "b.png", "t", spread={"a": steps})
    assert _png_size(shared)[1] > _png_size(plain)[1]


# --- the comparison's parts ---------------------------------------------------------------


def test_variant_syntax() -> None:
    assert compare.Variant.parse("old") == compare.Variant("old", {})
    assert compare.Variant.parse("old:") == compare.Variant("old", {})
    v = compare.Variant.parse("new:FRAUD_GATEWAY_TRANSPORT=stream,GRPC_X=a,b,FRAUD_Y=")
    assert v.name == "new"
    assert v.env == {"FRAUD_GATEWAY_TRANSPORT": "stream", "GRPC_X": "a,b", "FRAUD_Y": ""}
    for bad in ("", "a b:X=1", "../x:X=1", "n:X", "n:X=1,X=2", "n:1X=2"):
        with pytest.raises(ValueError):
            compare.Variant.parse(bad)


def test_a_variant_may_shape_the_mesh() -> None:
    v = compare.Variant.parse("two:gateway_replicas=2,scorer_replicas=2,FRAUD_GATEWAY_JOURNAL=off")
    assert v.replicas == {"gateway_replicas": 2, "scorer_replicas": 2}
    assert v.env == {"FRAUD_GATEWAY_JOURNAL": "off"}
    assert "`gateway_replicas=2`" in v.describe()
    for bad in ("n:envoy_replicas=0", "n:envoy_replicas=x", "n:scorer_replicas=10"):
        with pytest.raises(ValueError):
            compare.Variant.parse(bad)


def test_env_checks_name_product_settings_and_values() -> None:
    compare.check_env({"FRAUD_GATEWAY_MAX_IN_FLIGHT": "16", "PYTHONMALLOC": "malloc"})
    compare.check_env({"FRAUD_FEATURES_STORE": "redis", "FRAUD_FEATURES_PORT": "1"})
    with pytest.raises(ValueError, match="FRAUD_GATEWAY_MAX_INFLIGHT is not a setting"):
        compare.check_env({"FRAUD_GATEWAY_MAX_INFLIGHT": "16"})
    with pytest.raises(ValueError, match="no service's settings"):
        compare.check_env({"FRAUD_GATEWY_MAX_IN_FLIGHT": "16"})
    with pytest.raises(ValueError, match="GatewaySettings rejects"):
        compare.check_env({"FRAUD_GATEWAY_MAX_IN_FLIGHT": "many"})


def test_variants_are_two_or_more_with_distinct_names() -> None:
    a, b = compare.Variant("a"), compare.Variant("b", {"FRAUD_GATEWAY_MAX_IN_FLIGHT": "8"})
    compare.check_variants([a, b])
    for bad in ([a], [a, compare.Variant("a")], [a, compare.Variant("c", {"FRAUD_NOPE": "1"})]):
        with pytest.raises(ValueError):
            compare.check_variants(bad)


def test_rotation_alternates_two_and_rotates_more() -> None:
    a, b, c = compare.Variant("a"), compare.Variant("b"), compare.Variant("c")
    assert [[v.name for v in compare.rotation([a, b], i)] for i in range(3)] == [
        ["a", "b"],
        ["b", "a"],
        ["a", "b"],
    ]
    orders = [[v.name for v in compare.rotation([a, b, c], i)] for i in range(3)]
    for position in range(3):
        assert sorted(order[position] for order in orders) == ["a", "b", "c"]


def _runs() -> list[compare.Run]:
    """Two rounds of old and new at 200 and 400 rps; new reaches 400 only in round 1."""
    return [
        compare.Run("old", 1, 1, [_step(200, 6.0, cpu=4.0), _step(400, 10.0, cpu=4.0)], ["g"]),
        compare.Run(
            "new", 1, 2, [_step(200, 3.0, cpu=2.0, first=0.8), _step(400, 5.0, cpu=2.0)], ["g"]
        ),
        compare.Run("new", 2, 1, [_step(200, 4.0, cpu=3.0), _step(400, 9.0, default=0.2)], ["g"]),
        compare.Run("old", 2, 2, [_step(200, 8.0, cpu=4.0), _step(400, 12.0, cpu=4.0)], ["g"]),
    ]


VARIANTS = [compare.Variant("old"), compare.Variant("new", {"FRAUD_GATEWAY_MAX_IN_FLIGHT": "8"})]


def test_summary_has_every_round_medians_and_ratios_to_the_baseline() -> None:
    summary = compare.summarize(_runs(), VARIANTS, [200, 400], rounds=2)
    assert summary["baseline"] == "old"
    at200 = summary["rates"][0]
    assert at200["offered_rps"] == 200
    old, new = at200["variants"]["old"], at200["variants"]["new"]
    assert [c["round"] for c in old["cells"]] == [1, 2]
    assert old["median"]["p99_ms"] == pytest.approx(7.0)
    assert new["median"]["p99_ms"] == pytest.approx(3.5)
    assert new["median"]["cpu_ms_per_call"] == pytest.approx(2.5)
    assert new["median"]["cpu_by_process"]["gateway"] == pytest.approx(1.25)
    # The updater works after the answer: not on the request path.
    assert new["median"]["serving_cpu_ms_per_call"] == pytest.approx(2.0)
    assert new["median"]["default_share"] == 0.0
    assert new["median"]["first_stage_share"] == pytest.approx(0.4)
    assert new["median"]["small_model_share"] == 0.0
    assert at200["versus_baseline"] == {
        "new": {
            "p99": pytest.approx(0.5),
            "cpu_ms_per_call": pytest.approx(2.5 / 4.0),
            "serving_cpu_ms_per_call": pytest.approx(2.0 / 3.2),
        }
    }
    at400 = summary["rates"][1]["variants"]["new"]
    assert at400["rounds_full_quality"] == 1
    assert at400["median"]["default_share"] == pytest.approx(0.1)
    assert summary["full_quality"]["old"] == {
        "by_round": [400.0, 400.0],
        "every_round": 400.0,
        "median": 400.0,
    }
    assert summary["full_quality"]["new"] == {
        "by_round": [400.0, 200.0],
        "every_round": 200.0,
        "median": 300.0,
    }


def test_a_rate_not_reached_counts_only_the_rounds_that_ran_it() -> None:
    runs = [*_runs()[:3], compare.Run("old", 2, 2, [_step(200, 50.0)], ["g"])]
    summary = compare.summarize(runs, VARIANTS, [200, 400], rounds=2)
    old400 = summary["rates"][1]["variants"]["old"]
    assert old400["rounds_run"] == 1 and old400["median"]["p99_ms"] == pytest.approx(10.0)
    assert summary["full_quality"]["old"]["by_round"] == [400.0, None]
    assert summary["full_quality"]["old"]["every_round"] == 0.0


def test_report_files_hold_the_tables_the_plot_and_every_run(tmp_path: Path) -> None:
    base = runner.LoadtestConfig(rates=(200, 400), out_dir=tmp_path, store="redis")
    cfg = compare.CompareConfig(base, VARIANTS, rounds=2, command="fraudmesh loadtest …")
    assert cfg.report_name == "compare-redis-old-vs-new"
    result = compare.write_report(cfg, _runs(), datetime.now(UTC))

    text = result.markdown.read_text()
    for heading in (
        "## Medians over the rounds",
        "## Highest rate at full quality",
        "## Every run",
        "## CPU ms per Score by process (medians)",
        "## Peak RSS MB by process (medians)",
    ):
        assert heading in text
    assert "| 200 | old | 100 | 100 |" in text  # the gateway's peak RSS, and the total
    assert "| p99 vs old | CPU vs old | serving vs old |" in text
    assert "| 200 | new | 2/2 | " in text and "| 0.50× | 0.62× | 0.62× |" in text
    assert "| 200 | old | 2/2 | " in text and "| base | base | base |" in text
    assert "| 400 | new | 2 (1) |" in text  # round 2, ran first
    assert "| new | 400 rps | 200 rps | 200 rps | 300 rps |" in text
    assert "`FRAUD_GATEWAY_MAX_IN_FLIGHT=8`" in text
    assert f"]({result.plot.name})" in text
    assert _png_size(result.plot)[1] > 800  # latency and degraded panels
    saved = json.loads(result.json.read_text())
    assert [(r["variant"], r["round"]) for r in saved["runs"]] == [
        ("old", 1),
        ("new", 1),
        ("new", 2),
        ("old", 2),
    ]
    assert saved["runs"][2]["steps"][1]["degraded_shares"]["feature_source=default"] == 0.2
    assert saved["variants"][1] == {"name": "new", "env": {"FRAUD_GATEWAY_MAX_IN_FLIGHT": "8"}}


def test_a_comparison_refuses_a_running_target(tmp_path: Path) -> None:
    base = runner.LoadtestConfig(target="127.0.0.1:1", out_dir=tmp_path)
    with pytest.raises(ValueError, match="no target"):
        compare.run(compare.CompareConfig(base, VARIANTS))
