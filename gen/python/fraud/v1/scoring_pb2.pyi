import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_APPROVE: _ClassVar[Decision]
    DECISION_REVIEW: _ClassVar[Decision]
    DECISION_DECLINE: _ClassVar[Decision]

class ScoredBy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORED_BY_UNSPECIFIED: _ClassVar[ScoredBy]
    SCORED_BY_MODEL: _ClassVar[ScoredBy]
    SCORED_BY_RULES: _ClassVar[ScoredBy]
    SCORED_BY_FIRST_STAGE: _ClassVar[ScoredBy]
    SCORED_BY_SMALL_MODEL: _ClassVar[ScoredBy]

class FeatureSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEATURE_SOURCE_UNSPECIFIED: _ClassVar[FeatureSource]
    FEATURE_SOURCE_ONLINE: _ClassVar[FeatureSource]
    FEATURE_SOURCE_PARTIAL: _ClassVar[FeatureSource]
    FEATURE_SOURCE_DEFAULT: _ClassVar[FeatureSource]

class Channel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_UNSPECIFIED: _ClassVar[Channel]
    CHANNEL_CARD_PRESENT: _ClassVar[Channel]
    CHANNEL_CARD_NOT_PRESENT: _ClassVar[Channel]
DECISION_UNSPECIFIED: Decision
DECISION_APPROVE: Decision
DECISION_REVIEW: Decision
DECISION_DECLINE: Decision
SCORED_BY_UNSPECIFIED: ScoredBy
SCORED_BY_MODEL: ScoredBy
SCORED_BY_RULES: ScoredBy
SCORED_BY_FIRST_STAGE: ScoredBy
SCORED_BY_SMALL_MODEL: ScoredBy
FEATURE_SOURCE_UNSPECIFIED: FeatureSource
FEATURE_SOURCE_ONLINE: FeatureSource
FEATURE_SOURCE_PARTIAL: FeatureSource
FEATURE_SOURCE_DEFAULT: FeatureSource
CHANNEL_UNSPECIFIED: Channel
CHANNEL_CARD_PRESENT: Channel
CHANNEL_CARD_NOT_PRESENT: Channel

class ScoreRequest(_message.Message):
    __slots__ = ("transaction_id", "card_id", "merchant_id", "amount_minor", "currency", "timestamp", "terminal_id", "channel")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    MERCHANT_ID_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_MINOR_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    card_id: str
    merchant_id: str
    amount_minor: int
    currency: str
    timestamp: _timestamp_pb2.Timestamp
    terminal_id: str
    channel: Channel
    def __init__(self, transaction_id: _Optional[str] = ..., card_id: _Optional[str] = ..., merchant_id: _Optional[str] = ..., amount_minor: _Optional[int] = ..., currency: _Optional[str] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., terminal_id: _Optional[str] = ..., channel: _Optional[_Union[Channel, str]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("transaction_id", "decision", "score", "reasons", "model_version", "scored_by", "feature_source", "elapsed_ms")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCORED_BY_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    decision: Decision
    score: float
    reasons: _containers.RepeatedScalarFieldContainer[str]
    model_version: str
    scored_by: ScoredBy
    feature_source: FeatureSource
    elapsed_ms: float
    def __init__(self, transaction_id: _Optional[str] = ..., decision: _Optional[_Union[Decision, str]] = ..., score: _Optional[float] = ..., reasons: _Optional[_Iterable[str]] = ..., model_version: _Optional[str] = ..., scored_by: _Optional[_Union[ScoredBy, str]] = ..., feature_source: _Optional[_Union[FeatureSource, str]] = ..., elapsed_ms: _Optional[float] = ...) -> None: ...
