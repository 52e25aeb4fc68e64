"""The live writer's stored values equal what Feast's SQLite store writes for the same values."""

from __future__ import annotations

import math
import random

import pytest
from feast.protos.feast.types.Value_pb2 import Value

from services.featurestore import feast_internals
from services.featurestore.writer import stored_value

INTEGERS = [0, 1, 127, 128, 255, 300, 16_383, 16_384, 2**31, 2**53, 2**62, -1, -128, -(2**63)]
DOUBLES = [0.0, -0.0, 1.0, -1.5, 0.1, 1e-300, 1e300, 123_456.789, math.inf, -math.inf]


def _feast(value: float, integer: bool) -> tuple[bytes, str | None]:
    if math.isnan(value):
        message = Value()
    elif integer:
        message = Value(int64_val=int(value))
    else:
        message = Value(double_val=float(value))
    return message.SerializeToString(), feast_internals.sqlite_value_text(message)


@pytest.mark.parametrize("number", INTEGERS)
def test_an_integer_feature_is_stored_as_feast_stores_it(number: int) -> None:
    assert stored_value(float(number), True) == _feast(float(number), True)


@pytest.mark.parametrize("number", DOUBLES)
def test_a_float_feature_is_stored_as_feast_stores_it(number: float) -> None:
    assert stored_value(number, False) == _feast(number, False)


@pytest.mark.parametrize("integer", [True, False])
def test_a_nan_is_a_null_value_without_text(integer: bool) -> None:
    assert stored_value(math.nan, integer) == (b"", None) == _feast(math.nan, integer)


def test_random_values_of_both_types_are_stored_as_feast_stores_them() -> None:
    draw = random.Random(7)
    for _ in range(5_000):
        counts = float(draw.randrange(0, 10 ** draw.randrange(1, 12)))
        amount = draw.uniform(-1e6, 1e6) * 10 ** draw.randrange(-6, 3)
        assert stored_value(counts, True) == _feast(counts, True)
        assert stored_value(amount, False) == _feast(amount, False)
