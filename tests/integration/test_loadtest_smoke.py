"""A few seconds of the real load-test runner: mesh up, ghz open loop at low rates, report out."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from loadtest import compare, ghz, report, runner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ghz_binary() -> str:
    """ghz from PATH or $(go env GOPATH)/bin; the test fails (not skips) without it."""
    try:
        return ghz.find_ghz()
    except ghz.GhzNotFoundError as error:
        pytest.fail(str(error))


def test_runner_writes_a_sane_report(prepared_env: Any, tmp_path: Path, ghz_binary: str) -> None:
    cfg = runner.LoadtestConfig(
        var_dir=prepared_env.var_dir,
        rates=(20, 40),
        step_s=3.0,
        warmup_s=1.0,
        # Envoy still caps each call at 50 ms; a long client deadline keeps a scheduling
        # hiccup of the load generator on a busy machine from counting as the mesh's error.
        deadline_ms=1000.0,
        requests=300,
        saturated_steps=99,
        out_dir=tmp_path,
        name="smoke",
    )
    result = runner.run(cfg, log=lambda _: None)

    assert result.markdown.is_file() and result.plot.is_file() and result.summary.is_file()
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r.offered_rps for r in result.results] == [20.0, 40.0]
    for r in result.results:
        assert r.count >= 0.8 * r.offered_rps * cfg.step_s
        # Envoy caps a call at 50 ms: a starved machine may end a rare one there.
        late = r.status_counts.get("DeadlineExceeded", 0)
        assert set(r.status_counts) <= {"OK", "DeadlineExceeded"}, r.errors
        assert late <= 0.05 * r.count, r.errors
        assert 0.8 * r.offered_rps <= r.achieved_rps <= 1.2 * r.offered_rps
        assert 0 < r.p50_ms <= r.p90_ms <= r.p99_ms <= r.p999_ms <= r.max_ms < 1000
    assert set(result.processes) == {
        "features",
        "scorer",
        "gateway",
        "envoy",
        "updater",
        "decisionlog",
        "monitor",
    }
    for step in result.steps:
        for name in result.processes:
            assert 1 * 2**20 < step.peak_rss[name] < 4 * 2**30, (name, step.peak_rss)

    for step in result.steps:
        # The gateway's counters say how every answer was made: degraded shares are known.
        assert set(step.shares()) == set(report.DEGRADED), step.answers
        assert all(0.0 <= share <= 1.0 for share in step.shares().values())

    text = result.markdown.read_text()
    assert "| offered rps | achieved rps |" in text and "p99.9 ms" in text
    assert "| by rules | by small model | default features | partial features |" in text
    assert "smoke.png" in text
    summary = json.loads(result.summary.read_text())
    assert [s["offered_rps"] for s in summary["steps"]] == [20.0, 40.0]
    assert all(s["error_share"] <= 0.05 for s in summary["steps"])
    assert all(set(s["degraded_shares"]) == set(report.DEGRADED) for s in summary["steps"])


def test_compare_runs_each_variant_on_its_own_mesh(
    prepared_env: Any, tmp_path: Path, ghz_binary: str
) -> None:
    """Two variants, one round, one low rate: both run in turn on fresh meshes with their
    environment, and the report has every run, the medians and the degraded shares."""
    base = runner.LoadtestConfig(
        var_dir=prepared_env.var_dir,
        rates=(30,),
        step_s=2.0,
        warmup_s=1.0,
        deadline_ms=1000.0,
        requests=200,
        saturated_steps=99,
        out_dir=tmp_path,
        # Fewer processes start without the loop's consumers; the comparison is the same.
        live_loop=False,
    )
    variants = [
        compare.Variant.parse("wide:FRAUD_GATEWAY_MAX_IN_FLIGHT=64"),
        compare.Variant.parse("narrow:FRAUD_GATEWAY_MAX_IN_FLIGHT=32"),
    ]
    result = compare.run(compare.CompareConfig(base, variants, rounds=1), log=lambda _: None)

    assert [(r.variant, r.round, r.position) for r in result.runs] == [
        ("wide", 1, 1),
        ("narrow", 1, 2),
    ]
    for run in result.runs:
        assert set(run.processes) == {"features", "scorer", "gateway", "envoy"}
        [step] = run.steps
        assert step.result.offered_rps == 30.0 and step.result.count > 0
        assert set(step.shares()) == set(report.DEGRADED)
        assert step.cpu_ms > 0
    at30 = result.summary["rates"][0]
    assert set(at30["variants"]) == {"wide", "narrow"}
    for cell in at30["variants"].values():
        assert cell["rounds_run"] == 1
        assert cell["median"]["default_share"] is not None
        assert cell["median"]["rules_share"] is not None
    assert set(at30["versus_baseline"]) == {"narrow"}

    assert result.markdown.name == "compare-sqlite-no-loop-wide-vs-narrow.md"
    text = result.markdown.read_text()
    # A median with degraded answers is marked with a dagger; a run on a busy machine may have them.
    for name in ("wide", "narrow"):
        assert re.search(rf"\| 30 \| {name}( †)? \| 1/1 \|", text), text
    assert "`FRAUD_GATEWAY_MAX_IN_FLIGHT=32`" in text
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(result.json.read_text())
    assert [r["variant"] for r in saved["runs"]] == ["wide", "narrow"]
    # The scratch folder (state copies, logs) is gone after a good session.
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


@pytest.mark.parametrize("bare", [False, True], ids=["no-work", "bare-grpc"])
def test_floor_meshes_answer_every_call(
    prepared_env: Any,
    tmp_path: Path,
    ghz_binary: str,
    bare: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loadtest import data, noop

    # The floors' hops take the gateway's 42 ms budget split; this smoke checks that they
    # answer, not how fast (the floor benchmark does): one pause of a shared 2-core machine
    # made a hop's 12 ms cap run out. A second's budget, as the ghz calls' own deadline.
    monkeypatch.setenv("FRAUD_NOOP_BUDGET_S", "1.0")
    monkeypatch.setenv("FRAUD_NOOP_FEATURES_CAP_S", "0.5")
    floor = noop.FloorMesh(tmp_path / "logs", bare=bare)
    floor.start()
    try:
        population = data.sample_population(prepared_env.var_dir / "data", 100)
        file = data.write_data_file(tmp_path / "score.json", data.score_requests(population, "now"))
        result = ghz.run_ghz(
            ghz.SCORE, floor.envoy_target, file, rps=30, duration_s=2, timeout_ms=1000
        )
        assert floor.dead() == []
    finally:
        floor.stop()
    assert result.count >= 50
    assert result.status_counts.get("OK") == result.count, result.errors
