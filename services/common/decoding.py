"""Request decoding the server runtime does itself, so that hostile bytes get a clear status.

grpcio decodes requests before any servicer or interceptor code runs, and answers UNKNOWN
("Unexpected DecodeError") when the bytes are not a message of the method's type: garbage,
a truncated message, or a proto3 string that is not valid UTF-8. The runtime registers its
handlers with a pass-through deserializer and decodes with a ``RequestDecoder`` instead,
which raises ``InvalidArgument`` naming the offending field (found by walking the wire
format once the parser has failed, so the valid path pays nothing for it).

The decoder also checks what the parser accepts but later code cannot use: a
``google.protobuf.Timestamp`` outside years 1..9999 or with nanos outside [0, 1e9) (the
conversions raise on those), and an enum number the schema does not define (proto3 keeps
unknown numbers). The checks are compiled once per message type from its descriptor;
a type with nothing to check costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from services.common.errors import InvalidArgument

TIMESTAMP = "google.protobuf.Timestamp"
"""Full name of the well-known type whose range is checked."""

MIN_TIMESTAMP_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z, the earliest valid Timestamp."""

MAX_TIMESTAMP_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z, the latest valid Timestamp."""

NANOS_PER_SECOND = 1_000_000_000

MAX_DIAGNOSED_DEPTH = 32
"""Nesting depth beyond which the diagnosis stops looking (the parser's limit is 100)."""

Check = Callable[[Any], None]
"""Raises InvalidArgument when a decoded message breaks a rule."""


class RequestDecoder:
    """Parses one request type from bytes and checks it; failures raise ``InvalidArgument``."""

    __slots__ = ("_check", "_descriptor", "_parse")

    def __init__(self, message_class: type[Message], checked: bool = True) -> None:
        self._parse: Callable[[bytes], Message] = message_class.FromString
        self._descriptor: Any = message_class.DESCRIPTOR
        self._check = (
            compile_checks(message_class.DESCRIPTOR)  # type: ignore[arg-type]
            if checked
            else None
        )

    @classmethod
    def for_deserializer(
        cls, deserializer: Callable[[bytes], Any] | None, checked: bool = True
    ) -> RequestDecoder | None:
        """The decoder behind a generated stub's deserializer (``Message.FromString``), or
        None when the deserializer is something else and must be kept as it is. Unchecked,
        it only parses (and names the field where the bytes break)."""
        owner = getattr(deserializer, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, Message):
            return cls(owner, checked)
        return None

    @property
    def full_name(self) -> str:
        """The request type's full proto name."""
        return str(self._descriptor.full_name)

    def __call__(self, data: bytes) -> Message:
        """The decoded, checked request."""
        try:
            message = self._parse(data)
        except (DecodeError, UnicodeDecodeError):
            field, description = diagnose(self._descriptor, data)
            raise InvalidArgument(field, description) from None
        if self._check is not None:
            self._check(message)
        return message


# --- checks of decoded messages --------------------------------------------------------


def check_timestamp(field: str, seconds: int, nanos: int) -> None:
    """Raises InvalidArgument unless seconds/nanos make a valid google.protobuf.Timestamp."""
    if not MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(field, "is out of range: years 0001 to 9999 only")
    if not 0 <= nanos < NANOS_PER_SECOND:
        raise InvalidArgument(field, "has nanos out of range: 0 to 999999999 only")


def compile_checks(descriptor: Descriptor) -> Check | None:
    """One function that runs every check a message of ``descriptor`` needs, or None."""
    return _compile(descriptor, frozenset())


def _compile(descriptor: Descriptor, outer: frozenset[str]) -> Check | None:
    if descriptor.full_name in outer:
        # A recursive type: its fields are checked at the outer level already, and a
        # message cannot nest deeper than the parser's recursion limit anyway.
        return None
    inside = outer | {descriptor.full_name}
    checks: list[Check] = []
    for field in descriptor.fields:
        check = _field_check(field, inside)
        if check is not None:
            checks.append(check)
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]

    def run_all(message: Any) -> None:
        for check in checks:
            check(message)

    return run_all


def _field_check(field: FieldDescriptor, outer: frozenset[str]) -> Check | None:
    """The check of one field (single, repeated or map), or None when it needs none."""
    name = field.name
    message_type = field.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        value_field = message_type.fields_by_name["value"]
        map_value_check = _value_check(value_field, outer)
        if map_value_check is None:
            return None

        def check_map(message: Any) -> None:
            for key, value in getattr(message, name).items():
                map_value_check(f"{name}[{_key(key)}]", value)

        return check_map
    value_check = _value_check(field, outer)
    if value_check is None:
        return None
    if _is_repeated(field):

        def check_repeated(message: Any) -> None:
            for index, value in enumerate(getattr(message, name)):
                value_check(f"{name}[{index}]", value)

        return check_repeated
    if message_type is not None:

        def check_present(message: Any) -> None:
            if message.HasField(name):
                value_check(name, getattr(message, name))

        return check_present

    def check_scalar(message: Any) -> None:
        value_check(name, getattr(message, name))

    return check_scalar


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _key(key: object) -> str:
    """A map key for a field path, cut short: keys are client data."""
    text = repr(key)
    return text if len(text) <= 34 else text[:32] + "…"


def _value_check(
    field: FieldDescriptor, outer: frozenset[str]
) -> Callable[[str, Any], None] | None:
    """Checks one value of ``field`` (an element, for repeated fields) under a given path."""
    if field.enum_type is not None:
        return _enum_check(field.enum_type)
    message_type = field.message_type
    if message_type is None:
        return None
    if message_type.full_name == TIMESTAMP:

        def check_stamp(path: str, stamp: Any) -> None:
            check_timestamp(path, stamp.seconds, stamp.nanos)

        return check_stamp
    nested = _compile(message_type, outer)
    if nested is None:
        return None

    def check_nested(path: str, value: Any) -> None:
        try:
            nested(value)
        except InvalidArgument as error:
            raise InvalidArgument(f"{path}.{error.field}", error.description) from None

    return check_nested


def _enum_check(enum_type: EnumDescriptor) -> Callable[[str, Any], None] | None:
    if getattr(enum_type, "is_closed", False):
        # Closed (proto2) enums never hold unknown numbers: the parser keeps them aside.
        return None
    known = frozenset(enum_type.values_by_number)
    type_name = enum_type.name

    def check_enum(path: str, number: int) -> None:
        if number not in known:
            raise InvalidArgument(path, f"{number} is not a {type_name} value")

    return check_enum


# --- diagnosis of bytes the parser refused ----------------------------------------------


class _Malformed(Exception):
    """Where the wire format breaks: a field path (empty: the message itself) and why."""

    def __init__(self, path: str, description: str) -> None:
        super().__init__(path, description)
        self.path = path
        self.description = description


def diagnose(descriptor: Descriptor, data: bytes) -> tuple[str, str]:
    """Names the field at which ``data`` stops being a valid ``descriptor`` message, and why.

    Runs only after the parser refused ``data``; when the walk finds nothing more precise,
    the whole request is named.
    """
    generic = ("request", f"is not a valid {descriptor.full_name} message")
    try:
        _walk(descriptor, memoryview(data), "", 0)
    except _Malformed as problem:
        if not problem.path:
            return "request", f"{problem.description}: not a valid {descriptor.full_name} message"
        return problem.path, problem.description
    return generic


def _varint(data: memoryview, pos: int, path: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _Malformed(path, "is truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(path, "has a malformed varint")


def _walk(descriptor: Descriptor | None, data: memoryview, prefix: str, depth: int) -> None:
    """Walks one message's fields; raises _Malformed at the first broken one."""
    if depth > MAX_DIAGNOSED_DEPTH:
        raise _Malformed(prefix.rstrip("."), "is nested too deeply")
    counts: dict[int, int] = {}
    pos = 0
    end = len(data)
    while pos < end:
        tag, pos = _varint(data, pos, prefix.rstrip("."))
        number, wire_type = tag >> 3, tag & 7
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        # A broken unknown field is a broken message: name the message, not a number.
        path = prefix + field.name if field is not None else prefix.rstrip(".")
        if field is not None and _is_repeated(field):
            index = counts.get(number, 0)
            counts[number] = index + 1
            path = f"{path}[{index}]"
        if number == 0:
            raise _Malformed(prefix.rstrip("."), "has a field numbered 0")
        if wire_type == 0:
            _, pos = _varint(data, pos, path)
        elif wire_type == 1 or wire_type == 5:
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise _Malformed(path, "is truncated")
        elif wire_type == 2:
            length, pos = _varint(data, pos, path)
            if pos + length > end:
                raise _Malformed(path, "is truncated")
            chunk = data[pos : pos + length]
            pos += length
            if field is not None:
                _check_length_delimited(field, chunk, path, depth)
        elif wire_type == 3:
            pos = _skip_group(data, pos, number, path, depth)
        else:
            raise _Malformed(path, f"has an invalid wire type {wire_type}")


def _check_length_delimited(
    field: FieldDescriptor, chunk: memoryview, path: str, depth: int
) -> None:
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            bytes(chunk).decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(path, "is not valid UTF-8") from None
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        # Map entries are messages too: a bad value shows as ``name[i].value``.
        _walk(field.message_type, chunk, path + ".", depth + 1)


def _skip_group(data: memoryview, pos: int, number: int, path: str, depth: int) -> int:
    """Skips an (unknown) group up to its END_GROUP tag; returns the position after it."""
    if depth > MAX_DIAGNOSED_DEPTH:
        raise _Malformed(path, "is nested too deeply")
    end = len(data)
    while pos < end:
        tag, pos = _varint(data, pos, path)
        inner_number, wire_type = tag >> 3, tag & 7
        if wire_type == 4:
            if inner_number != number:
                raise _Malformed(path, "has a mismatched group end")
            return pos
        if wire_type == 0:
            _, pos = _varint(data, pos, path)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            length, pos = _varint(data, pos, path)
            pos += length
        elif wire_type == 3:
            pos = _skip_group(data, pos, inner_number, path, depth + 1)
        else:
            raise _Malformed(path, f"has an invalid wire type {wire_type}")
        if pos > end:
            raise _Malformed(path, "is truncated")
    raise _Malformed(path, "is truncated")
