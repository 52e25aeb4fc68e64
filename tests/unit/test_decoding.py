"""The runtime's own request decoding: every refusal is InvalidArgument naming the field."""

from __future__ import annotations

import time

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fraud.v1 import features_pb2, scoring_pb2
from inference import grpc_predict_v2_pb2 as v2
from services.common import decoding
from services.common.decoding import RequestDecoder
from services.common.errors import InvalidArgument

SCORE = RequestDecoder(scoring_pb2.ScoreRequest)


def _valid(**overrides: object) -> scoring_pb2.ScoreRequest:
    fields: dict[str, object] = {
        "transaction_id": "t-1",
        "card_id": "card-1",
        "merchant_id": "m-1",
        "amount_minor": 1250,
        "currency": "EUR",
        "timestamp": Timestamp(seconds=int(time.time())),
        "terminal_id": "term-1",
        "channel": scoring_pb2.CHANNEL_CARD_PRESENT,
    }
    fields.update(overrides)
    return scoring_pb2.ScoreRequest(**fields)  # type: ignore[arg-type]


def _refusal(decoder: RequestDecoder, data: bytes) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        decoder(data)
    return caught.value


def _string_field(number: int, raw: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``raw`` (valid UTF-8 or not)."""
    return bytes([number << 3 | 2, len(raw)]) + raw


def test_valid_request_decodes_unchanged() -> None:
    request = _valid()
    assert SCORE(request.SerializeToString()) == request


def test_empty_bytes_are_an_empty_request() -> None:
    assert SCORE(b"") == scoring_pb2.ScoreRequest()


@pytest.mark.parametrize(
    ("number", "field"),
    [
        (1, "transaction_id"),
        (2, "card_id"),
        (3, "merchant_id"),
        (5, "currency"),
        (7, "terminal_id"),
    ],
)
def test_invalid_utf8_names_the_string_field(number: int, field: str) -> None:
    data = _valid().SerializeToString() + _string_field(number, b"\xff\xfe\xfd")
    error = _refusal(SCORE, data)
    assert error.field == field
    assert "UTF-8" in error.description


def test_invalid_utf8_in_a_nested_repeated_message_names_its_path() -> None:
    request = v2.ModelInferRequest(model_name="m")
    request.inputs.add(name="a", datatype="FP32")
    request.inputs.add(name="b", datatype="FP32")
    data = request.SerializeToString().replace(b"\x0a\x01b", b"\x0a\x01\xff")
    error = _refusal(RequestDecoder(v2.ModelInferRequest), data)
    assert error.field == "inputs[1].name"


def test_truncated_message_names_the_cut_field() -> None:
    data = _valid().SerializeToString()
    error = _refusal(SCORE, data[:-1])
    assert error.field == "channel"
    assert error.description == "is truncated"


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff\xff\x0f\x01", b"\x07", b"\x00\x00", b"\x0c", b"\x80" * 11],
)
def test_garbage_names_the_request(data: bytes) -> None:
    error = _refusal(SCORE, data)
    assert error.field in ("request", "transaction_id")
    assert len(error.message) < 200


@pytest.mark.parametrize(
    ("seconds", "nanos", "ok"),
    [
        (decoding.MIN_TIMESTAMP_SECONDS, 0, True),
        (decoding.MAX_TIMESTAMP_SECONDS, 999_999_999, True),
        (decoding.MIN_TIMESTAMP_SECONDS - 1, 0, False),
        (decoding.MAX_TIMESTAMP_SECONDS + 1, 0, False),
        (0, -1, False),
        (0, 1_000_000_000, False),
        (-(2**63), 0, False),
        (2**63 - 1, 2**31 - 1, False),
    ],
)
def test_timestamp_range(seconds: int, nanos: int, ok: bool) -> None:
    data = _valid(timestamp=Timestamp(seconds=seconds, nanos=nanos)).SerializeToString()
    if ok:
        assert SCORE(data).timestamp.seconds == seconds
    else:
        assert _refusal(SCORE, data).field == "timestamp"


def test_timestamps_are_checked_in_every_request_type() -> None:
    request = features_pb2.GetFeaturesRequest(
        card_id="c", merchant_id="m", as_of=Timestamp(seconds=0, nanos=-5)
    )
    error = _refusal(RequestDecoder(features_pb2.GetFeaturesRequest), request.SerializeToString())
    assert error.field == "as_of"


def test_unknown_enum_number_is_refused() -> None:
    error = _refusal(SCORE, _valid(channel=77).SerializeToString())
    assert error.field == "channel"
    assert "77" in error.description


def test_types_without_checks_pay_nothing() -> None:
    assert decoding.compile_checks(v2.ModelInferRequest.DESCRIPTOR) is None
    assert decoding.compile_checks(scoring_pb2.ScoreRequest.DESCRIPTOR) is not None


def test_a_foreign_deserializer_is_kept() -> None:
    assert RequestDecoder.for_deserializer(bytes) is None
    assert RequestDecoder.for_deserializer(None) is None
    decoder = RequestDecoder.for_deserializer(scoring_pb2.ScoreRequest.FromString)
    assert decoder is not None and decoder.full_name == "fraud.v1.ScoreRequest"


@settings(
    max_examples=3000,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.binary(max_size=300))
def test_any_bytes_decode_or_are_refused_as_invalid_argument(data: bytes) -> None:
    for decoder in (SCORE, RequestDecoder(v2.ModelInferRequest)):
        try:
            decoder(data)
        except InvalidArgument as error:
            assert error.field
            assert len(error.message) < 300


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(st.data())
def test_truncations_and_corruptions_of_valid_requests(data: st.DataObject) -> None:
    raw = bytearray(_valid().SerializeToString())
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3))
    for position, value in flips:
        if position < cut:
            raw[position] = value
    try:
        SCORE(bytes(raw[:cut]))
    except InvalidArgument as error:
        assert error.field
