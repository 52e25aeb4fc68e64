"""The handbook benchmark's summary over seeds: each version's spread and the paired
differences, and its table."""

from __future__ import annotations

import pytest

from loadtest import external


def _seed(seed: int, before: float, after: float) -> dict[str, object]:
    def figures(ap: float) -> dict[str, float]:
        return {"auc_roc": 0.87, "average_precision": ap, "card_precision_at_100": 0.3,
                "train_seconds": 10.0}  # fmt: skip

    return {
        "seed": seed,
        "versions": {
            "before": {"handbook periods": figures(before)},
            "after": {"handbook periods": figures(after)},
        },
    }


def test_paired_differences_carry_the_spread_of_the_seeds() -> None:
    seeds = [_seed(0, 0.66, 0.69), _seed(1, 0.70, 0.72), _seed(2, 0.68, 0.71)]
    summary = external.summary(seeds)["handbook periods"]
    assert summary["before"]["average_precision"]["mean"] == pytest.approx(0.68)
    assert summary["before"]["average_precision"]["sd"] == pytest.approx(0.02)
    diff = summary["after_minus_before"]["average_precision"]
    assert diff["mean"] == pytest.approx((0.03 + 0.02 + 0.03) / 3)
    assert (diff["min"], diff["max"], diff["n"]) == (pytest.approx(0.02), pytest.approx(0.03), 3)
    table = external.markdown(
        {
            "seeds": seeds,
            "commits": {"before": "abc", "after": "def"},
            "baselines": {
                "Random forest": dict(zip(external._MAIN, (0.867, 0.658, 0.287), strict=True))
            },
            "best_published": external.BEST_PUBLISHED,
            "summary": external.summary(seeds),
        }
    )
    assert "| fraudmesh after − before, per seed, handbook periods (mean ± sd, n=3) |" in table
    assert "+0.027 ± 0.006" in table
    # AP moved by more than its spread; AUC and CP@100 did not move at all.
    assert summary["verdict"] == {
        "auc_roc": "within the spread",
        "average_precision": "better",
        "card_precision_at_100": "within the spread",
    }
    assert (
        "| verdict: the paired difference against its spread, handbook periods "
        "| within the spread | better | within the spread |"
    ) in table


@pytest.mark.parametrize(
    ("differences", "expected"),
    [
        ([0.010, 0.012, 0.008], "better"),
        ([-0.010, -0.012, -0.008], "worse"),
        # A mean of +0.003 against a spread of 0.008: noise, whatever its sign.
        ([0.012, -0.004, 0.001], "within the spread"),
        ([0.05], "one seed: no spread"),
    ],
)
def test_a_difference_is_named_only_when_it_exceeds_its_spread(
    differences: list[float], expected: str
) -> None:
    assert external.verdict(external._spread(differences)) == expected


def test_seeds_must_be_a_list_of_numbers() -> None:
    assert external._seeds("0,1, 2") == [0, 1, 2]
    with pytest.raises(SystemExit) as exit_:
        external.main(["--seeds", "one"])
    assert exit_.value.code == 2
