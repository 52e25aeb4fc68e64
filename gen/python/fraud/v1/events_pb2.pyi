import datetime

from fraud.v1 import outcomes_pb2 as _outcomes_pb2
from fraud.v1 import scoring_pb2 as _scoring_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Route(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_UNSPECIFIED: _ClassVar[Route]
    ROUTE_LIVE: _ClassVar[Route]
    ROUTE_CANARY: _ClassVar[Route]

class ListChange(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIST_CHANGE_UNSPECIFIED: _ClassVar[ListChange]
    LIST_CHANGE_ADD: _ClassVar[ListChange]
    LIST_CHANGE_REMOVE: _ClassVar[ListChange]
    LIST_CHANGE_EXPIRE: _ClassVar[ListChange]
ROUTE_UNSPECIFIED: Route
ROUTE_LIVE: Route
ROUTE_CANARY: Route
LIST_CHANGE_UNSPECIFIED: ListChange
LIST_CHANGE_ADD: ListChange
LIST_CHANGE_REMOVE: ListChange
LIST_CHANGE_EXPIRE: ListChange

class DecisionEvent(_message.Message):
    __slots__ = ("event_id", "transaction_id", "card_id", "merchant_id", "amount_minor", "currency", "timestamp", "terminal_id", "card_not_present", "features", "feature_names", "feature_schema", "feature_source", "score", "decision", "scored_by", "model_version", "route", "shadow_score", "shadow_model_version", "reasons", "elapsed_ms", "decided_at", "missing_features", "canary_failed_version", "canary_timed_out", "shadow_rules")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    MERCHANT_ID_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_MINOR_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_ID_FIELD_NUMBER: _ClassVar[int]
    CARD_NOT_PRESENT_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_NAMES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    SCORED_BY_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_SCORE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    MISSING_FEATURES_FIELD_NUMBER: _ClassVar[int]
    CANARY_FAILED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    SHADOW_RULES_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    transaction_id: str
    card_id: str
    merchant_id: str
    amount_minor: int
    currency: str
    timestamp: _timestamp_pb2.Timestamp
    terminal_id: str
    card_not_present: bool
    features: _containers.RepeatedScalarFieldContainer[float]
    feature_names: _containers.RepeatedScalarFieldContainer[str]
    feature_schema: str
    feature_source: _scoring_pb2.FeatureSource
    score: float
    decision: _scoring_pb2.Decision
    scored_by: _scoring_pb2.ScoredBy
    model_version: str
    route: Route
    shadow_score: float
    shadow_model_version: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    elapsed_ms: float
    decided_at: _timestamp_pb2.Timestamp
    missing_features: _containers.RepeatedScalarFieldContainer[int]
    canary_failed_version: str
    canary_timed_out: bool
    shadow_rules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, event_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., card_id: _Optional[str] = ..., merchant_id: _Optional[str] = ..., amount_minor: _Optional[int] = ..., currency: _Optional[str] = ..., timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., terminal_id: _Optional[str] = ..., card_not_present: _Optional[bool] = ..., features: _Optional[_Iterable[float]] = ..., feature_names: _Optional[_Iterable[str]] = ..., feature_schema: _Optional[str] = ..., feature_source: _Optional[_Union[_scoring_pb2.FeatureSource, str]] = ..., score: _Optional[float] = ..., decision: _Optional[_Union[_scoring_pb2.Decision, str]] = ..., scored_by: _Optional[_Union[_scoring_pb2.ScoredBy, str]] = ..., model_version: _Optional[str] = ..., route: _Optional[_Union[Route, str]] = ..., shadow_score: _Optional[float] = ..., shadow_model_version: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ..., elapsed_ms: _Optional[float] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., missing_features: _Optional[_Iterable[int]] = ..., canary_failed_version: _Optional[str] = ..., canary_timed_out: _Optional[bool] = ..., shadow_rules: _Optional[_Iterable[str]] = ...) -> None: ...

class OutcomeEvent(_message.Message):
    __slots__ = ("event_id", "transaction_id", "outcome", "reported_at", "source", "received_at", "reported_by")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    REPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    transaction_id: str
    outcome: _outcomes_pb2.Outcome
    reported_at: _timestamp_pb2.Timestamp
    source: _outcomes_pb2.OutcomeSource
    received_at: _timestamp_pb2.Timestamp
    reported_by: str
    def __init__(self, event_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., outcome: _Optional[_Union[_outcomes_pb2.Outcome, str]] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[_Union[_outcomes_pb2.OutcomeSource, str]] = ..., received_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reported_by: _Optional[str] = ...) -> None: ...

class ListChangeEvent(_message.Message):
    __slots__ = ("event_id", "change", "list", "kind", "value", "reason", "expires_at", "actor", "changed_at", "generation")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    change: ListChange
    list: str
    kind: str
    value: str
    reason: str
    expires_at: _timestamp_pb2.Timestamp
    actor: str
    changed_at: _timestamp_pb2.Timestamp
    generation: int
    def __init__(self, event_id: _Optional[str] = ..., change: _Optional[_Union[ListChange, str]] = ..., list: _Optional[str] = ..., kind: _Optional[str] = ..., value: _Optional[str] = ..., reason: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., changed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., generation: _Optional[int] = ...) -> None: ...

class EventEnvelope(_message.Message):
    __slots__ = ("decision", "outcome", "list_change")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LIST_CHANGE_FIELD_NUMBER: _ClassVar[int]
    decision: DecisionEvent
    outcome: OutcomeEvent
    list_change: ListChangeEvent
    def __init__(self, decision: _Optional[_Union[DecisionEvent, _Mapping]] = ..., outcome: _Optional[_Union[OutcomeEvent, _Mapping]] = ..., list_change: _Optional[_Union[ListChangeEvent, _Mapping]] = ...) -> None: ...
