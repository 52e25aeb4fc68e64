"""The hostile suite's judging rules (``loadtest.hostile.judge``): what makes a run fail."""

from __future__ import annotations

from loadtest import hostile
from loadtest.hostile import Case, Outcome

INVALID_CARD = Case("Score: card_id empty", hostile.SCORE, b"", hostile.INVALID, ("card_id",))
VALID = Case(hostile.VALID_SCORE_KIND, hostile.SCORE, b"", hostile.VALID_SCORE)


def _outcomes(
    case: Case, code: str, n: int, details: str = "", retried: tuple[str, str] | None = None
) -> list[Outcome]:
    retries = (retried,) if retried else ()
    return [Outcome(case, code, details, retries) for _ in range(n)]


def test_the_expected_status_naming_the_field_passes() -> None:
    outcomes = _outcomes(INVALID_CARD, "INVALID_ARGUMENT", 100, "card_id: is required")
    assert hostile.judge(outcomes, 0.0) == []


def test_invalid_argument_naming_another_field_fails() -> None:
    outcomes = _outcomes(INVALID_CARD, "INVALID_ARGUMENT", 1, "merchant_id: is required")
    assert hostile.judge(outcomes, 0.0)
    # A field whose name starts like the expected one is another field.
    outcomes = _outcomes(INVALID_CARD, "INVALID_ARGUMENT", 1, "card_idx: is required")
    assert hostile.judge(outcomes, 0.0)


def test_another_status_or_a_forbidden_one_fails() -> None:
    for code in ("OK", "INTERNAL", "UNKNOWN", "UNAVAILABLE", "NOT_FOUND"):
        assert hostile.judge(_outcomes(INVALID_CARD, code, 1), 0.0), code


def test_a_validation_that_hangs_fails_by_cap_and_by_retry() -> None:
    # Every call of the kind late, and late again when re-sent alone.
    hung = _outcomes(INVALID_CARD, "DEADLINE_EXCEEDED", 100, retried=("DEADLINE_EXCEEDED", ""))
    problems = hostile.judge(hung, 0.0)
    assert any("100 of 100 calls answered DEADLINE_EXCEEDED" in p for p in problems)
    assert any("got DEADLINE_EXCEEDED" in p for p in problems)
    # Even with a late baseline of 50 % the cap is below a kind that is always late.
    assert hostile.judge(hung + _outcomes(VALID, "DEADLINE_EXCEEDED", 1), 0.5)


def test_a_late_answer_within_the_cap_passes_once_the_retry_gets_the_status() -> None:
    outcomes = _outcomes(INVALID_CARD, "INVALID_ARGUMENT", 99, "card_id: is required")
    late = _outcomes(
        INVALID_CARD, "DEADLINE_EXCEEDED", 1, retried=("INVALID_ARGUMENT", "card_id: x")
    )
    assert hostile.judge(outcomes + late, 0.0) == []
    # Two late first answers: one more than the cap of 1 + ceil(0 x 101).
    assert hostile.judge(outcomes + late + late, 0.0)
    # The same run's valid calls were 2 % late: the cap grows to 1 + ceil(0.02 x 101) = 4.
    assert hostile.judge(outcomes + late * 3, 0.02) == []


def test_valid_score_calls_may_be_shed_or_late_and_set_the_baseline() -> None:
    outcomes = (
        _outcomes(VALID, "OK", 96)
        + _outcomes(VALID, "DEADLINE_EXCEEDED", 3)
        + _outcomes(VALID, "RESOURCE_EXHAUSTED", 1)
    )
    assert hostile.judge(outcomes, hostile.baseline_late_share(outcomes)) == []
    assert hostile.baseline_late_share(outcomes) == 0.03


def test_a_kind_the_run_did_not_judge_enough_is_reported() -> None:
    outcomes = _outcomes(INVALID_CARD, "INVALID_ARGUMENT", 5, "card_id: is required")
    assert hostile.missing_kinds(outcomes, [INVALID_CARD.kind, "Score: other"], 5) == [
        "Score: other: 0 calls"
    ]


def test_every_suite_judges_every_kind_it_generates() -> None:
    population = hostile.Population(["card-1"], ["merch-00001"])
    repository = hostile.Repository("fraud-lgbm", "1", "2")
    for suite in (
        hostile.score_suite(population),
        hostile.outcome_suite(),
        hostile.features_suite(population),
        hostile.stream_suite(population),
        hostile.repository_suite(repository),
    ):
        judged = suite.judged_kinds()
        assert len(judged) == len(set(judged)) >= len(suite.kinds) - 1, suite.name
