"""The supervisor's restart policy: exponential backoff, forgetting old crashes, giving up."""

from __future__ import annotations

import pytest

from services.mesh import CrashHistory, RestartPolicy


def test_backoff_doubles_up_to_its_cap() -> None:
    history = CrashHistory(
        RestartPolicy(backoff_initial_s=0.5, backoff_max_s=3.0, max_crashes=10, window_s=100)
    )
    assert [history.record(t) for t in (0, 1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_gives_up_after_max_crashes_within_the_window() -> None:
    history = CrashHistory(RestartPolicy(max_crashes=3, window_s=60))
    assert history.record(0) is not None
    assert history.record(10) is not None
    assert history.record(20) is None
    assert history.recent(20) == 3


def test_old_crashes_are_forgotten_and_backoff_starts_over() -> None:
    history = CrashHistory(RestartPolicy(backoff_initial_s=1, max_crashes=3, window_s=60))
    assert history.record(0) == 1
    assert history.record(30) == 2
    # 61 s later the first crash has left the window: two recent, not three.
    assert history.record(61) == 2
    assert history.record(200) == 1


@pytest.mark.parametrize("policy", [{"max_crashes": 0}, {"window_s": 0}, {"backoff_initial_s": -1}])
def test_invalid_policies_are_refused(policy: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**policy)  # type: ignore[arg-type]
