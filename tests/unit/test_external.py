"""The handbook benchmark's summary over seeds: each version's spread and the paired
differences, and its table."""

from __future__ import annotations

import pandas as pd
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


def _payment(day: int, card: int, terminal: int, scenario: int) -> dict[str, int]:
    return {
        "TX_TIME_SECONDS": day * 86_400 + 43_200,
        "TX_TIME_DAYS": day,
        "CUSTOMER_ID": card,
        "TERMINAL_ID": terminal,
        "TX_FRAUD": int(scenario > 0),
        "TX_FRAUD_SCENARIO": scenario,
    }


def test_card_precision_bounds_count_only_frauds_a_payment_or_a_known_label_reveals() -> None:
    """Terminal 9 is compromised from day 0: its frauds of days 3 and 5 show nothing yet
    (no label is back before day 7), those of day 10 follow a label known since day 7.
    Card 4's fraud on day 3 is an unusual amount (scenario 3): revealed at once."""
    history = [_payment(0, 1, 9, 2)]
    test_rows = [
        _payment(3, 2, 9, 2), _payment(3, 3, 8, 0), _payment(3, 4, 7, 3),
        _payment(5, 5, 9, 2), _payment(5, 6, 8, 0),
        _payment(10, 7, 9, 2), _payment(10, 8, 8, 0),
    ]  # fmt: skip
    tx = pd.DataFrame(history + test_rows)
    test = pd.DataFrame(test_rows)
    bounds = external.card_precision_bounds(tx, test, k=1)
    # The ceiling finds a fraudulent card every day; the reachable ranking on day 3 (card 4)
    # and day 10 (card 7), and on day 5 only the genuine card 6 ranks above card 5.
    assert bounds["card_precision_at_1_ceiling"] == pytest.approx(1.0)
    assert bounds["card_precision_at_1_reachable"] == pytest.approx(2 / 3)
    # A label 35 days old has left the longest fraud-rate window: it reveals nothing.
    late = [_payment(40, 7, 9, 2), _payment(40, 8, 8, 0)]
    bounds = external.card_precision_bounds(pd.DataFrame(history + late), pd.DataFrame(late), 1)
    assert bounds["card_precision_at_1_reachable"] == 0.0


def test_the_stored_bound_reads_a_terminals_labels_as_of_its_previous_payment() -> None:
    """Terminal 9 is compromised from day 0 (noon). The label of that fraud is back on day 7
    at noon: the payment then reveals it (reachable), but the store's row of terminal 9 is
    as of its payment on day 6, when no label was back (stored)."""
    history = [_payment(0, 1, 9, 2)]
    test_rows = [
        _payment(6, 2, 9, 2), _payment(6, 3, 8, 0),
        _payment(7, 7, 9, 2), _payment(7, 8, 8, 0),
    ]  # fmt: skip
    bounds = external.card_precision_bounds(
        pd.DataFrame(history + test_rows), pd.DataFrame(test_rows), 1
    )
    assert bounds["card_precision_at_1_ceiling"] == pytest.approx(1.0)
    assert bounds["card_precision_at_1_reachable"] == pytest.approx(1 / 2)
    assert bounds["card_precision_at_1_stored"] == 0.0
    # A payment on day 8 reads the row of the day-7 payment, which holds the label.
    later = [*test_rows, _payment(8, 4, 9, 2), _payment(8, 5, 8, 0)]
    bounds = external.card_precision_bounds(pd.DataFrame(history + later), pd.DataFrame(later), 1)
    assert bounds["card_precision_at_1_stored"] == pytest.approx(1 / 3)
    assert bounds["card_precision_at_1_reachable"] == pytest.approx(2 / 3)


def test_bounds_only_reports_each_seed_and_the_gap_between_the_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # More genuine cards on day 7 than the 100 a day's ranking takes: only the reachable
    # ranking puts the fraudulent card 7 among them.
    history = [_payment(0, 1, 9, 2)]
    genuine = [_payment(7, 100 + i, 8, 0) for i in range(150)]
    rows = [_payment(6, 2, 9, 2), _payment(7, 7, 9, 2), *genuine]
    monkeypatch.setattr(external, "generate", lambda seed: pd.DataFrame(history + rows))
    monkeypatch.setattr(external, "protocol_test_rows", lambda tx, _rows: pd.DataFrame(rows))
    found = external.bounds_only([0, 1])
    assert [r["seed"] for r in found["seeds"]] == [0, 1]
    assert found["summary"]["card_precision_at_100_reachable"]["mean"] == pytest.approx(0.01)
    assert found["summary"]["card_precision_at_100_stored"]["mean"] == pytest.approx(0.005)
    assert found["reachable_minus_stored"]["mean"] == pytest.approx(0.005)
    text = external.bounds_markdown(found)
    assert "| mean ± sd |" in text and "CP@100 stored" in text


def test_missed_cards_sorts_the_revealed_cards_by_what_reveals_them() -> None:
    """On day 8 the store's rows (as of the day-7 payments) count two frauds at terminal 9
    and one at terminal 7; card 12's fraud shows in its amount (scenario 1). The model's top
    two are cards 10 and 12: card 11, revealed by one known fraud, is missed."""
    early = {**_payment(0, 2, 9, 2), "TX_TIME_SECONDS": 21_600}
    history = [
        _payment(0, 1, 9, 2), early, _payment(0, 3, 7, 2),
        _payment(7, 50, 9, 0), _payment(7, 51, 7, 0),
    ]  # fmt: skip
    test_rows = [
        _payment(8, 10, 9, 2),
        _payment(8, 11, 7, 2),
        _payment(8, 12, 5, 1),
        _payment(8, 13, 5, 0),
    ]
    test = pd.DataFrame(test_rows).assign(score=[0.9, 0.1, 0.8, 0.5])
    found = external.missed_cards(pd.DataFrame(history + test_rows), test, k=2)
    assert found == {
        "caught": {"amount": 1, "terminal_2_or_more": 1, "terminal_1": 0},
        "missed": {"amount": 0, "terminal_2_or_more": 0, "terminal_1": 1},
    }


def test_the_summary_sums_the_missed_cards_over_the_seeds() -> None:
    found = {
        "caught": {"amount": 5, "terminal_1": 1, "terminal_2_or_more": 9},
        "missed": {"amount": 1, "terminal_1": 3, "terminal_2_or_more": 0},
    }
    figures = {"auc_roc": 0.9, "average_precision": 0.7, "card_precision_at_100": 0.3}
    seeds = [
        {
            "seed": seed,
            "versions": {"after": {"handbook periods": {**figures, "missed_cards": found}}},
        }
        for seed in (0, 1)
    ]
    total = external.summary(seeds)["handbook periods"]["after"]["missed_cards"]
    assert total == {
        "caught": {"amount": 10, "terminal_1": 2, "terminal_2_or_more": 18},
        "missed": {"amount": 2, "terminal_1": 6, "terminal_2_or_more": 0},
    }
