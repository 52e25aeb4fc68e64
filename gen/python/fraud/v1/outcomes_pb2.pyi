import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_FRAUD: _ClassVar[Outcome]
    OUTCOME_LEGITIMATE: _ClassVar[Outcome]
    OUTCOME_DISPUTED: _ClassVar[Outcome]

class OutcomeSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_SOURCE_UNSPECIFIED: _ClassVar[OutcomeSource]
    OUTCOME_SOURCE_CHARGEBACK: _ClassVar[OutcomeSource]
    OUTCOME_SOURCE_ANALYST: _ClassVar[OutcomeSource]
    OUTCOME_SOURCE_CUSTOMER: _ClassVar[OutcomeSource]
    OUTCOME_SOURCE_ISSUER: _ClassVar[OutcomeSource]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_FRAUD: Outcome
OUTCOME_LEGITIMATE: Outcome
OUTCOME_DISPUTED: Outcome
OUTCOME_SOURCE_UNSPECIFIED: OutcomeSource
OUTCOME_SOURCE_CHARGEBACK: OutcomeSource
OUTCOME_SOURCE_ANALYST: OutcomeSource
OUTCOME_SOURCE_CUSTOMER: OutcomeSource
OUTCOME_SOURCE_ISSUER: OutcomeSource

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("transaction_id", "outcome", "reported_at", "source", "reported_by")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    outcome: Outcome
    reported_at: _timestamp_pb2.Timestamp
    source: OutcomeSource
    reported_by: str
    def __init__(self, transaction_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[_Union[OutcomeSource, str]] = ..., reported_by: _Optional[str] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("transaction_id", "event_id", "received_at")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    event_id: str
    received_at: _timestamp_pb2.Timestamp
    def __init__(self, transaction_id: _Optional[str] = ..., event_id: _Optional[str] = ..., received_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
