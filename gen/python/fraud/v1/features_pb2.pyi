import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FeatureStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FEATURE_STATUS_UNSPECIFIED: _ClassVar[FeatureStatus]
    FEATURE_STATUS_PRESENT: _ClassVar[FeatureStatus]
    FEATURE_STATUS_MISSING: _ClassVar[FeatureStatus]
    FEATURE_STATUS_STALE: _ClassVar[FeatureStatus]
FEATURE_STATUS_UNSPECIFIED: FeatureStatus
FEATURE_STATUS_PRESENT: FeatureStatus
FEATURE_STATUS_MISSING: FeatureStatus
FEATURE_STATUS_STALE: FeatureStatus

class GetFeaturesRequest(_message.Message):
    __slots__ = ("card_id", "merchant_id", "as_of", "terminal_id")
    CARD_ID_FIELD_NUMBER: _ClassVar[int]
    MERCHANT_ID_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_ID_FIELD_NUMBER: _ClassVar[int]
    card_id: str
    merchant_id: str
    as_of: _timestamp_pb2.Timestamp
    terminal_id: str
    def __init__(self, card_id: _Optional[str] = ..., merchant_id: _Optional[str] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., terminal_id: _Optional[str] = ...) -> None: ...

class Feature(_message.Message):
    __slots__ = ("name", "value", "status", "event_timestamp")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    status: FeatureStatus
    event_timestamp: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., status: _Optional[_Union[FeatureStatus, str]] = ..., event_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetFeaturesResponse(_message.Message):
    __slots__ = ("features",)
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    features: _containers.RepeatedCompositeFieldContainer[Feature]
    def __init__(self, features: _Optional[_Iterable[_Union[Feature, _Mapping]]] = ...) -> None: ...

class StreamFeaturesRequest(_message.Message):
    __slots__ = ("id", "timeout_us", "lookups", "traceparents")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENTS_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_us: int
    lookups: _containers.RepeatedCompositeFieldContainer[GetFeaturesRequest]
    traceparents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., timeout_us: _Optional[int] = ..., lookups: _Optional[_Iterable[_Union[GetFeaturesRequest, _Mapping]]] = ..., traceparents: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamFeaturesResponse(_message.Message):
    __slots__ = ("id", "results", "error_code", "error_message")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    results: _containers.RepeatedCompositeFieldContainer[GetFeaturesResponse]
    error_code: int
    error_message: str
    def __init__(self, id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[GetFeaturesResponse, _Mapping]]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...
