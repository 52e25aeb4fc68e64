"""Hostile traffic for every RPC that takes client input: generated calls, valid and not, each
with the status it must get.

Four suites of hypothesis-generated calls, each a catalogue of kinds (``Suite.kinds``):

- **score** (through Envoy): ``fraud.v1.FraudScoring/Score`` with one field made invalid at a
  time (empty, long, control-character, non-printable and invalid-UTF-8 ids; negative and
  extreme amounts; unknown currencies; missing, future, stale, out-of-range timestamps and
  nanos; unknown channel numbers), garbage and truncated bytes, oversized messages, valid
  transactions with odd printable text or tiny deadlines, and garbage to
  ``grpc.health.v1.Health/Check``;
- **outcome** (through Envoy): ``fraud.v1.OutcomeService/ReportOutcome`` with bad ids,
  unspecified and unknown enum numbers (``outcome``, ``source``), missing, future, too old and
  out-of-range ``reported_at``, garbage, truncated and oversized bytes;
- **features** (the feature service directly: Envoy does not route it):
  ``fraud.v1.FeatureService/GetFeatures`` with bad ids and out-of-range ``as_of``, garbage,
  truncated and oversized bytes; and ``StreamFeatures`` streams mixing valid requests, requests
  with bad lookups or none, and messages that are not a message at all;
- **repository** (the scorer directly): ``RepositoryModelLoad``/``RepositoryModelUnload`` with
  path-like versions (separators, ``..``, absolute paths, NUL, over-long, signs, non-digits,
  leading zeros, as a string, an integer or inside a ``config`` JSON), path-like model and
  repository names, unknown parameters, unreadable configs; ``RepositoryIndex``; and
  ``ModelInfer``/``ModelReady``/``ModelMetadata`` naming path-like versions.

How a run is judged (``judge``), kind by kind:

- a call of an invalid kind must end with its status: INVALID_ARGUMENT whose message starts
  with the field's name (``Case.fields``), RESOURCE_EXHAUSTED for oversize, NOT_FOUND for a
  plain name or version that does not exist; INTERNAL, UNKNOWN and UNAVAILABLE never;
- valid calls get OK; valid ``Score`` calls may also be shed (RESOURCE_EXHAUSTED, the
  gateway's in-flight limit) or late (DEADLINE_EXCEEDED: Envoy ends a scoring call after
  50 ms), and no other valid call may;
- DEADLINE_EXCEEDED for a call that must get another status: the call is re-sent alone (up
  to ``RETRIES`` times) and must then get its status, and per kind at most
  ``late_allowance`` first answers may be late: 1 + the share of the run's valid ``Score``
  calls that were late, times the kind's calls. A machine that stalls makes every kind late
  alike (the baseline grows with it); a validation that hangs makes its own kind late every
  time, which the cap and the retry both catch.

``tests/integration/test_hostile_input.py`` runs the suites against a mesh in ``make test``;
``python -m loadtest.hostile`` runs a randomly seeded batch and prints the status counts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fraud.v1 import features_pb2 as fpb
from fraud.v1 import outcomes_pb2 as opb
from fraud.v1 import scoring_pb2 as pb
from inference import grpc_predict_v2_pb2 as v2
from loadtest import data
from services import client
from services.domain import money
from services.domain.validation import MAX_ID_LENGTH
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig
from services.models import repository

SCORE = "/fraud.v1.FraudScoring/Score"
REPORT_OUTCOME = "/fraud.v1.OutcomeService/ReportOutcome"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
GET_FEATURES = "/fraud.v1.FeatureService/GetFeatures"
STREAM_FEATURES = "/fraud.v1.FeatureService/StreamFeatures"
_V2 = "/inference.GRPCInferenceService/"
REPOSITORY_LOAD = _V2 + "RepositoryModelLoad"
REPOSITORY_UNLOAD = _V2 + "RepositoryModelUnload"
REPOSITORY_INDEX = _V2 + "RepositoryIndex"
MODEL_INFER = _V2 + "ModelInfer"
MODEL_READY = _V2 + "ModelReady"
MODEL_METADATA = _V2 + "ModelMetadata"

FORBIDDEN = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE"})
"""Statuses hostile input must never get."""

OK = frozenset({"OK"})
INVALID = frozenset({"INVALID_ARGUMENT"})
VALID_SCORE = frozenset({"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})
"""What a valid Score call may get: an answer, or shed / late on a saturated machine."""

MIN_VALID_AMOUNT_MINOR = 0
"""The smallest ``amount_minor`` a valid Score carries: the one place the generator writes the
gateway's amount rule (valid requests draw from here up; invalid ones below it)."""

MAX_DETAILS = 600
"""Longest status message accepted back: echoed values are capped."""

RETRIES = 2
"""Times a call answered late in its batch is re-sent alone before its answer counts."""

DEADLINE_S = 2.0
"""Deadline of every generated call (Envoy caps Score at 50 ms by itself)."""

CURRENCIES = ("EUR", "USD", "GBP", "JPY", "CHF")
"""Currencies of valid requests (small amounts in each stay under the amount limit)."""

_DAY = 86_400
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


@dataclass(frozen=True)
class Case:
    """One call: what is sent, and the statuses it must end with."""

    kind: str
    method: str
    data: bytes
    expected: frozenset[str]
    fields: tuple[str, ...] = ()
    """For INVALID_ARGUMENT: the message must start with one of these field names."""
    timeout_s: float = DEADLINE_S
    streamed: bool = False
    """Sent as the one message of a stream (``StreamFeatures``); judged on its reply."""
    request_id: int = 0
    """The id of a streamed request, which its reply carries."""

    @property
    def late_is_expected(self) -> bool:
        """Whether DEADLINE_EXCEEDED is among its statuses (then it is neither capped nor
        retried)."""
        return "DEADLINE_EXCEEDED" in self.expected


@dataclass(frozen=True)
class Stream:
    """Several requests on one ``StreamFeatures`` stream, and how the stream itself ends."""

    kind: str
    requests: tuple[Case, ...]
    ending: Case | None = None
    """A last message that is not a message: the stream ends with its status."""


Call = Case | Stream


@dataclass(frozen=True)
class Outcome:
    """What one call (or one streamed request) got; ``retries`` are the answers it got when
    re-sent alone after a late first answer."""

    case: Case
    code: str
    details: str
    retries: tuple[tuple[str, str], ...] = ()

    @property
    def final(self) -> tuple[str, str]:
        """The answer that counts: the last retry's, else the first."""
        return self.retries[-1] if self.retries else (self.code, self.details)

    @property
    def late_first(self) -> bool:
        """Answered DEADLINE_EXCEEDED in its batch although it must get another status."""
        return self.code == "DEADLINE_EXCEEDED" and not self.case.late_is_expected


def _names_field(details: str, fields: Sequence[str]) -> bool:
    for name in fields:
        if details.startswith(name):
            rest = details[len(name) :]
            if not rest or rest[0] in ":.[" or name.endswith("["):
                return True
    return False


def problem(outcome: Outcome) -> str | None:
    """Why the outcome's answer (after retries) breaks the rules, or None."""
    case = outcome.case
    code, details = outcome.final
    if code in FORBIDDEN or code not in case.expected:
        return f"{case.kind}: got {code} ({details[:120]!r}), expected {sorted(case.expected)}"
    if len(details) > MAX_DETAILS:
        return f"{case.kind}: status message of {len(details)} characters"
    if code == "INVALID_ARGUMENT" and case.fields and not _names_field(details, case.fields):
        return f"{case.kind}: {details[:120]!r} names none of {list(case.fields)[:6]}"
    return None


def late_allowance(calls: int, baseline_late_share: float) -> int:
    """Most first answers of a kind that may be late: 1, plus the baseline share of its calls."""
    return 1 + math.ceil(baseline_late_share * calls)


def baseline_late_share(outcomes: Sequence[Outcome]) -> float:
    """The share of valid Score calls answered DEADLINE_EXCEEDED (0 without any)."""
    valid = [o for o in outcomes if o.case.kind == VALID_SCORE_KIND]
    return sum(o.code == "DEADLINE_EXCEEDED" for o in valid) / len(valid) if valid else 0.0


def judge(outcomes: Sequence[Outcome], baseline: float) -> list[str]:
    """Every broken rule of the run (see the module doc); empty when all hold."""
    problems = [p for o in outcomes if (p := problem(o)) is not None]
    by_kind: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_kind[outcome.case.kind].append(outcome)
    for kind, group in sorted(by_kind.items()):
        late = sum(o.late_first for o in group)
        allowed = late_allowance(len(group), baseline)
        if late > allowed:
            problems.append(
                f"{kind}: {late} of {len(group)} calls answered DEADLINE_EXCEEDED "
                f"(at most {allowed}: baseline {baseline:.1%} of valid Score calls)"
            )
    return problems


def missing_kinds(outcomes: Sequence[Outcome], kinds: Iterable[str], at_least: int) -> list[str]:
    """Kinds of the catalogue generated fewer than ``at_least`` times."""
    counts = Counter(o.case.kind for o in outcomes)
    return [f"{k}: {counts[k]} calls" for k in sorted(kinds) if counts[k] < at_least]


# --- building blocks ---------------------------------------------------------------------


def _length_delimited(number: int, raw: bytes) -> bytes:
    """A length-delimited field ``number`` (< 16) holding ``raw``, as the wire has it."""
    length = len(raw)
    prefix = bytearray([number << 3 | 2])
    while True:
        byte, length = length & 0x7F, length >> 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(prefix) + raw


def _field_names(message: type[Message]) -> tuple[str, ...]:
    """Every top-level field of ``message``, and ``request`` (the whole message)."""
    return ("request", *(f.name for f in message.DESCRIPTOR.fields))


_CONTROL = st.sampled_from(["\x00", "\n", "\r\n", "\x1b[31m", "\x7f", "\x9b"])
_NON_PRINTABLE = st.characters(categories=["Cc", "Cf", "Co", "Zl", "Zp", "Zs"]).filter(
    lambda c: c != " "
)
"""Characters ``str.isprintable`` refuses (the ids' rule): controls, format characters (bidi
overrides, zero-width joiners), private use, separators other than the ASCII space."""
_PRINTABLE_ODD = st.text(
    alphabet=st.characters(categories=["L", "M", "N", "P", "S"], exclude_characters="\x7f"),
    min_size=1,
    max_size=40,
)
"""Unusual but printable text: emoji, combining marks, CJK, right-to-left letters."""

_INVALID_UTF8 = st.sampled_from(
    [b"\xff", b"\xc3\x28", b"\xa0\xa1", b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\xed\xa0\x80"]
)


def _wrapped(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(lambda a, c, b: a + c + b, st.text(max_size=8), inner, st.text(max_size=8))


def _too_long_id() -> st.SearchStrategy[str]:
    return st.text(min_size=MAX_ID_LENGTH + 1, max_size=MAX_ID_LENGTH + 1500)


def _bad_utf8() -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda a, bad, b: a + bad + b, st.binary(max_size=8), _INVALID_UTF8, st.binary(max_size=8)
    )


def _stamp(seconds: int, nanos: int = 0) -> Timestamp:
    return Timestamp(seconds=seconds, nanos=nanos)


_OUT_OF_RANGE_SECONDS = st.integers(-(2**63), _MIN_SECONDS - 1) | st.integers(
    _MAX_SECONDS + 1, 2**63 - 1
)
_BAD_NANOS = st.integers(-(2**31), -1) | st.integers(10**9, 2**31 - 1)


@dataclass(frozen=True)
class Suite:
    """One family of RPCs: its kinds of calls, sent in rounds of one call of every kind (so
    every kind gets as many calls as any other, whatever hypothesis favours)."""

    name: str
    kinds: Mapping[str, st.SearchStrategy[Call]]

    def round(self) -> st.SearchStrategy[list[Call]]:
        """One call of every kind, in the catalogue's order."""
        return st.tuples(*(self.kinds[name] for name in sorted(self.kinds))).map(list)

    def judged_kinds(self) -> list[str]:
        """The kinds every run of some size must have judged: the catalogue's, with a
        truncation judged as cut mid-field (cuts at a field boundary are rarer) and a
        stream as its requests and endings."""
        kinds = []
        for name in self.kinds:
            if name.endswith(TRUNCATED):
                kinds.append(name + " mid-field")
            elif name == STREAM_KIND:
                kinds.extend(STREAM_REQUEST_KINDS)
            else:
                kinds.append(name)
        return sorted(kinds)


TRUNCATED = ": truncated"
"""Ending of the kinds whose calls are named by how the cut fell."""


def _garbage_and_truncation(
    prefix: str,
    method: str,
    message: type[Message],
    valid: st.SearchStrategy[Message],
    required: Callable[[Message], list[str]],
    valid_expected: frozenset[str],
    max_request_bytes: int | None,
    oversize_field: int,
) -> dict[str, st.SearchStrategy[Call]]:
    """Kinds every unary RPC gets: garbage, truncated (mid-field or at a field boundary) and,
    with a request limit, oversized bytes."""
    names = _field_names(message)

    def truncated(request: Message, cut_at: int) -> Case:
        raw = request.SerializeToString()
        cut = raw[: cut_at % max(len(raw), 1)]
        try:
            parsed = message.FromString(cut)
        except DecodeError:
            return Case(f"{prefix}{TRUNCATED} mid-field", method, cut, INVALID, names)
        missing = required(parsed)
        if missing:
            return Case(
                f"{prefix}{TRUNCATED}, a required field missing",
                method,
                cut,
                INVALID,
                tuple(missing),
            )
        return Case(f"{prefix}{TRUNCATED}, still complete", method, cut, valid_expected)

    kinds: dict[str, st.SearchStrategy[Call]] = {
        f"{prefix}: garbage bytes": st.binary(min_size=1, max_size=512).map(
            lambda b: Case("", method, b, INVALID, names)
        ),
        # One kind: the three outcomes of a cut are judged under their own names.
        f"{prefix}{TRUNCATED}": st.builds(truncated, valid, st.integers(0, 10_000)),
    }
    if max_request_bytes is not None:
        limit = max_request_bytes

        def oversized(request: Message, char: str, times: int) -> Case:
            raw = request.SerializeToString() + _length_delimited(
                oversize_field, (char * times).encode()
            )
            return Case("", method, raw, frozenset({"RESOURCE_EXHAUSTED"}))

        kinds[f"{prefix}: oversized"] = st.builds(
            oversized, valid, st.sampled_from("xé€😀"), st.integers(limit, 4 * limit)
        )
    return kinds


def _renamed(call: Call, kind: str) -> Call:
    return replace(call, kind=kind) if isinstance(call, Case) else call


# --- Score (through Envoy) ---------------------------------------------------------------


@dataclass(frozen=True)
class Population:
    """Entities valid requests use; unknown ones are fine too (default features)."""

    card_ids: Sequence[str]
    merchant_ids: Sequence[str]

    def __repr__(self) -> str:
        # Short: hypothesis prints strategies (with this as an argument) in its reports.
        return f"Population({len(self.card_ids)} cards, {len(self.merchant_ids)} merchants)"


VALID_SCORE_KIND = "Score: valid"

_SCORE_STRINGS = {"transaction_id": 1, "card_id": 2, "merchant_id": 3, "currency": 5}
_SCORE_IDS = {"transaction_id": True, "card_id": True, "merchant_id": True, "terminal_id": False}
"""ScoreRequest's ids and whether each is required."""


@st.composite
def _score_fields(draw: st.DrawFn, population: Population) -> dict[str, object]:
    # Strategies must not depend on the clock (hypothesis replays them): draw an offset.
    stamp = time.time() + draw(st.floats(-6 * _DAY, 60))
    return {
        "transaction_id": "h-" + draw(st.text("abcdef0123456789", min_size=8, max_size=24)),
        "card_id": draw(st.sampled_from(population.card_ids)),
        "merchant_id": draw(st.sampled_from(population.merchant_ids)),
        "amount_minor": draw(st.integers(MIN_VALID_AMOUNT_MINOR, 50_000)),
        "currency": draw(st.sampled_from(CURRENCIES)),
        "timestamp": _stamp(int(stamp), draw(st.integers(0, 999_999_999))),
        "terminal_id": draw(st.sampled_from(["", "term-0001", "T" * MAX_ID_LENGTH])),
        "channel": draw(st.sampled_from([0, 1, 2])),
    }


def _score(fields: Mapping[str, object]) -> pb.ScoreRequest:
    request = pb.ScoreRequest(**fields)  # type: ignore[arg-type]
    return request


def _score_required(request: Message) -> list[str]:
    assert isinstance(request, pb.ScoreRequest)
    missing = [
        n
        for n in ("transaction_id", "card_id", "merchant_id", "currency")
        if not getattr(request, n)
    ]
    if request.amount_minor < MIN_VALID_AMOUNT_MINOR:
        missing.append("amount_minor")
    if not request.HasField("timestamp"):
        missing.append("timestamp")
    return missing


def score_suite(population: Population, max_request_bytes: int = 16 * 1024) -> Suite:
    """Score and health calls through Envoy (see the module doc)."""
    fields = _score_fields(population)

    def invalid(
        name: str, value: st.SearchStrategy[object], **extra: object
    ) -> st.SearchStrategy[Call]:
        def build(f: dict[str, object], v: object) -> Case:
            f = {**f, **extra}
            if v is _MISSING:
                del f[name]
            else:
                f[name] = v
            return Case("", SCORE, _score(f).SerializeToString(), INVALID, (name,))

        return st.builds(build, fields, value)

    def bad_utf8(name: str) -> st.SearchStrategy[Call]:
        number = {**_SCORE_STRINGS, "terminal_id": 7}[name]
        # The last occurrence of a field wins, so appending it replaces the valid value.
        return st.builds(
            lambda f, raw: Case(
                "",
                SCORE,
                _score(f).SerializeToString() + _length_delimited(number, raw),
                INVALID,
                (name,),
            ),
            fields,
            _bad_utf8(),
        )

    kinds: dict[str, st.SearchStrategy[Call]] = {
        VALID_SCORE_KIND: fields.map(
            lambda f: Case("", SCORE, _score(f).SerializeToString(), VALID_SCORE)
        ),
        "Score: valid, odd printable text in an id": st.builds(
            lambda f, name, text: Case(
                "", SCORE, _score({**f, name: text}).SerializeToString(), VALID_SCORE
            ),
            fields,
            st.sampled_from(sorted(_SCORE_IDS)),
            _PRINTABLE_ODD,
        ),
        "Score: valid, tiny deadline": st.builds(
            lambda f, t: Case("", SCORE, _score(f).SerializeToString(), VALID_SCORE, timeout_s=t),
            fields,
            st.floats(0.0001, 0.003),
        ),
        "Score: amount_minor below the minimum": invalid(
            "amount_minor",
            st.integers(-(2**63), MIN_VALID_AMOUNT_MINOR - 1) | st.just(MIN_VALID_AMOUNT_MINOR - 1),
            currency="EUR",
        ),
        "Score: amount_minor over the limit": invalid(
            "amount_minor", st.integers(100_000_001, 2**63 - 1), currency="EUR"
        ),
        "Score: currency unknown": invalid(
            "currency",
            st.text(max_size=12).filter(lambda c: not money.is_known(c))
            | st.sampled_from(["eur", "EURO", "XXX1", "", " EUR", "EUR\x00"]),
        ),
        "Score: timestamp missing": invalid("timestamp", st.just(_MISSING)),
        "Score: timestamp in the future": invalid(
            "timestamp",
            st.integers(3_600, 10**12).map(
                lambda ahead: _stamp(min(int(time.time()) + ahead, _MAX_SECONDS))
            ),
        ),
        "Score: timestamp too old": invalid(
            "timestamp",
            st.integers(8 * _DAY, 10**12).map(
                lambda behind: _stamp(max(int(time.time()) - behind, _MIN_SECONDS))
            ),
        ),
        "Score: timestamp out of range": invalid("timestamp", _OUT_OF_RANGE_SECONDS.map(_stamp)),
        "Score: timestamp nanos out of range": invalid(
            "timestamp", _BAD_NANOS.map(lambda n: _stamp(int(time.time()), n))
        ),
        "Score: channel unknown": invalid(
            "channel", st.integers(3, 2**31 - 1) | st.integers(-(2**31), -1)
        ),
        "Health/Check: garbage bytes": st.binary(max_size=64).map(_health_case),
    }
    for name, required in _SCORE_IDS.items():
        if required:
            kinds[f"Score: {name} empty"] = invalid(name, st.just(""))
        kinds[f"Score: {name} too long"] = invalid(name, _too_long_id())
        kinds[f"Score: {name} with control characters"] = invalid(name, _wrapped(_CONTROL))
        kinds[f"Score: {name} with non-printable characters"] = invalid(
            name, _wrapped(_NON_PRINTABLE)
        )
        kinds[f"Score: {name} not UTF-8"] = bad_utf8(name)
    kinds["Score: currency not UTF-8"] = bad_utf8("currency")
    kinds.update(
        _garbage_and_truncation(
            "Score",
            SCORE,
            pb.ScoreRequest,
            fields.map(_score),
            _score_required,
            VALID_SCORE,
            max_request_bytes,
            oversize_field=2,
        )
    )
    return Suite("score", _named(kinds))


_MISSING = object()


def _named(kinds: Mapping[str, st.SearchStrategy[Call]]) -> dict[str, st.SearchStrategy[Call]]:
    """Stamps each kind's name on its calls (truncation names its own three outcomes)."""
    return {
        name: strategy if name.endswith(TRUNCATED) else _stamped(strategy, name)
        for name, strategy in kinds.items()
    }


def _stamped(strategy: st.SearchStrategy[Call], kind: str) -> st.SearchStrategy[Call]:
    return strategy.map(lambda call: _renamed(call, kind))


def _health_case(raw: bytes) -> Case:
    try:
        request = health_pb2.HealthCheckRequest.FromString(raw)
    except DecodeError:
        return Case("", HEALTH_CHECK, raw, INVALID, ("request", "service"))
    # An empty name is the server as a whole; another is SERVING or NOT_FOUND.
    expected = OK if not request.service else frozenset({"OK", "NOT_FOUND"})
    return Case("", HEALTH_CHECK, raw, expected)


# --- ReportOutcome (through Envoy) ---------------------------------------------------------

_OUTCOME_MAX_AGE_DAYS = 540


@st.composite
def _outcome_fields(draw: st.DrawFn) -> dict[str, object]:
    stamp = time.time() + draw(st.floats(-(_OUTCOME_MAX_AGE_DAYS - 1) * _DAY, 60))
    return {
        "transaction_id": "h-" + draw(st.text("abcdef0123456789", min_size=8, max_size=24)),
        "outcome": draw(st.sampled_from([1, 2, 3])),
        "source": draw(st.sampled_from([1, 2, 3, 4])),
        "reported_at": _stamp(int(stamp), draw(st.integers(0, 999_999_999))),
    }


def _outcome(fields: Mapping[str, object]) -> opb.ReportOutcomeRequest:
    return opb.ReportOutcomeRequest(**fields)  # type: ignore[arg-type]


def _outcome_required(request: Message) -> list[str]:
    assert isinstance(request, opb.ReportOutcomeRequest)
    missing = [n for n in ("transaction_id", "outcome", "source") if not getattr(request, n)]
    if not request.HasField("reported_at"):
        missing.append("reported_at")
    return missing


def outcome_suite(max_request_bytes: int = 16 * 1024) -> Suite:
    """ReportOutcome through Envoy (see the module doc)."""
    fields = _outcome_fields()

    def invalid(name: str, value: st.SearchStrategy[object]) -> st.SearchStrategy[Call]:
        def build(f: dict[str, object], v: object) -> Case:
            f = dict(f)
            if v is _MISSING:
                del f[name]
            else:
                f[name] = v
            return Case("", REPORT_OUTCOME, _outcome(f).SerializeToString(), INVALID, (name,))

        return st.builds(build, fields, value)

    unknown_enum = st.integers(5, 2**31 - 1) | st.integers(-(2**31), -1)
    kinds: dict[str, st.SearchStrategy[Call]] = {
        "ReportOutcome: valid": fields.map(
            lambda f: Case("", REPORT_OUTCOME, _outcome(f).SerializeToString(), OK)
        ),
        "ReportOutcome: transaction_id empty": invalid("transaction_id", st.just("")),
        "ReportOutcome: transaction_id too long": invalid("transaction_id", _too_long_id()),
        "ReportOutcome: transaction_id with control characters": invalid(
            "transaction_id", _wrapped(_CONTROL)
        ),
        "ReportOutcome: transaction_id with non-printable characters": invalid(
            "transaction_id", _wrapped(_NON_PRINTABLE)
        ),
        "ReportOutcome: transaction_id not UTF-8": st.builds(
            lambda f, raw: Case(
                "",
                REPORT_OUTCOME,
                _outcome(f).SerializeToString() + _length_delimited(1, raw),
                INVALID,
                ("transaction_id",),
            ),
            fields,
            _bad_utf8(),
        ),
        "ReportOutcome: outcome unspecified": invalid("outcome", st.just(0)),
        "ReportOutcome: outcome unknown number": invalid(
            "outcome", st.integers(4, 2**31 - 1) | st.integers(-(2**31), -1)
        ),
        "ReportOutcome: source unspecified": invalid("source", st.just(0)),
        "ReportOutcome: source unknown number": invalid("source", unknown_enum),
        "ReportOutcome: reported_at missing": invalid("reported_at", st.just(_MISSING)),
        "ReportOutcome: reported_at in the future": invalid(
            "reported_at",
            st.integers(3_600, 10**12).map(
                lambda a: _stamp(min(int(time.time()) + a, _MAX_SECONDS))
            ),
        ),
        "ReportOutcome: reported_at too old": invalid(
            "reported_at",
            st.integers((_OUTCOME_MAX_AGE_DAYS + 2) * _DAY, 10**12).map(
                lambda b: _stamp(max(int(time.time()) - b, _MIN_SECONDS))
            ),
        ),
        "ReportOutcome: reported_at out of range": invalid(
            "reported_at", _OUT_OF_RANGE_SECONDS.map(_stamp)
        ),
        "ReportOutcome: reported_at nanos out of range": invalid(
            "reported_at", _BAD_NANOS.map(lambda n: _stamp(int(time.time()), n))
        ),
    }
    kinds.update(
        _garbage_and_truncation(
            "ReportOutcome",
            REPORT_OUTCOME,
            opb.ReportOutcomeRequest,
            fields.map(_outcome),
            _outcome_required,
            OK,
            max_request_bytes,
            oversize_field=1,
        )
    )
    return Suite("outcome", _named(kinds))


# --- FeatureService (directly) -------------------------------------------------------------

_FEATURE_IDS = {"card_id": True, "merchant_id": True, "terminal_id": False}
_FEATURE_STRINGS = {"card_id": 1, "merchant_id": 2, "terminal_id": 4}


@st.composite
def _lookup_fields(draw: st.DrawFn, population: Population) -> dict[str, object]:
    fields: dict[str, object] = {
        "card_id": draw(st.sampled_from([*population.card_ids, "card-unknown-0001"])),
        "merchant_id": draw(st.sampled_from(population.merchant_ids)),
        "terminal_id": draw(st.sampled_from(["", "term-0001", "T" * MAX_ID_LENGTH])),
    }
    # Any Timestamp in range is a point in time to judge freshness against.
    as_of = draw(st.none() | st.integers(_MIN_SECONDS, _MAX_SECONDS))
    if as_of is not None:
        fields["as_of"] = _stamp(as_of, draw(st.integers(0, 999_999_999)))
    return fields


def _lookup(fields: Mapping[str, object]) -> fpb.GetFeaturesRequest:
    return fpb.GetFeaturesRequest(**fields)  # type: ignore[arg-type]


def _lookup_required(request: Message) -> list[str]:
    return [n for n in ("card_id", "merchant_id") if not getattr(request, n)]


def _bad_lookups(
    population: Population,
) -> dict[str, st.SearchStrategy[tuple[dict[str, object], str]]]:
    """Lookup fields with one field made invalid, and that field's name, by kind."""
    fields = _lookup_fields(population)

    def invalid(
        name: str, value: st.SearchStrategy[object]
    ) -> st.SearchStrategy[tuple[dict[str, object], str]]:
        return st.builds(lambda f, v: ({**f, name: v}, name), fields, value)

    kinds = {
        "as_of out of range": invalid("as_of", _OUT_OF_RANGE_SECONDS.map(_stamp)),
        "as_of nanos out of range": invalid("as_of", _BAD_NANOS.map(lambda n: _stamp(0, n))),
    }
    for name, required in _FEATURE_IDS.items():
        if required:
            kinds[f"{name} empty"] = invalid(name, st.just(""))
        kinds[f"{name} too long"] = invalid(name, _too_long_id())
        kinds[f"{name} with control characters"] = invalid(name, _wrapped(_CONTROL))
        kinds[f"{name} with non-printable characters"] = invalid(name, _wrapped(_NON_PRINTABLE))
    return kinds


def features_suite(population: Population, max_request_bytes: int = 16 * 1024) -> Suite:
    """GetFeatures calls and StreamFeatures streams, to the feature service."""
    fields = _lookup_fields(population)
    kinds: dict[str, st.SearchStrategy[Call]] = {
        "GetFeatures: valid": fields.map(
            lambda f: Case("", GET_FEATURES, _lookup(f).SerializeToString(), OK)
        ),
    }
    for kind, bad in _bad_lookups(population).items():
        kinds[f"GetFeatures: {kind}"] = bad.map(
            lambda fv: Case("", GET_FEATURES, _lookup(fv[0]).SerializeToString(), INVALID, (fv[1],))
        )
    for name, number in _FEATURE_STRINGS.items():
        kinds[f"GetFeatures: {name} not UTF-8"] = st.builds(
            lambda f, raw, name=name, number=number: Case(
                "",
                GET_FEATURES,
                _lookup(f).SerializeToString() + _length_delimited(number, raw),
                INVALID,
                (name,),
            ),
            fields,
            _bad_utf8(),
        )
    kinds.update(
        _garbage_and_truncation(
            "GetFeatures",
            GET_FEATURES,
            fpb.GetFeaturesRequest,
            fields.map(_lookup),
            _lookup_required,
            OK,
            max_request_bytes,
            oversize_field=1,
        )
    )
    return Suite("features", _named(kinds))


STREAM_KIND = "StreamFeatures: a stream"
_STREAM_HOW = ("valid", "valid, tiny timeout_us", "no lookups")
_BAD_LOOKUP_KINDS = tuple(sorted(_bad_lookups(Population(["c"], ["m"]))))
_ENDINGS = {
    "garbage": "StreamFeatures: a message of garbage bytes ends the stream",
    "bad UTF-8": "StreamFeatures: a message not UTF-8 ends the stream",
}
STREAM_REQUEST_KINDS = (
    "StreamFeatures: request valid",
    "StreamFeatures: request valid, tiny timeout_us",
    "StreamFeatures: request with no lookups",
    *(f"StreamFeatures: request with a lookup's {k}" for k in _BAD_LOOKUP_KINDS),
    *_ENDINGS.values(),
)
"""What a stream's requests and endings are judged as."""


def stream_suite(population: Population) -> Suite:
    """StreamFeatures streams, to the feature service (one stream per generated call)."""
    return Suite("streams", {STREAM_KIND: _streams(population)})


def _stream_request(
    kind: str,
    request: fpb.StreamFeaturesRequest,
    expected: frozenset[str],
    fields: tuple[str, ...] = (),
) -> Case:
    return Case(
        f"StreamFeatures: {kind}",
        STREAM_FEATURES,
        request.SerializeToString(),
        expected,
        fields,
        timeout_s=5.0,
        streamed=True,
        request_id=request.id,
    )


@st.composite
def _streams(draw: st.DrawFn, population: Population) -> Stream:
    fields = _lookup_fields(population)
    bad = _bad_lookups(population)
    requests = []
    for request_id in range(1, draw(st.integers(1, 6)) + 1):
        how = draw(st.sampled_from([*_STREAM_HOW, *_BAD_LOOKUP_KINDS]))
        if how.startswith("valid"):
            lookups = [_lookup(f) for f in draw(st.lists(fields, min_size=1, max_size=4))]
            tiny = how.endswith("timeout_us")
            request = fpb.StreamFeaturesRequest(
                id=request_id, lookups=lookups, timeout_us=draw(st.integers(1, 50)) if tiny else 0
            )
            # A request that waited past its own timeout_us is answered DEADLINE_EXCEEDED.
            expected = frozenset({"OK", "DEADLINE_EXCEEDED"}) if tiny else OK
            requests.append(_stream_request(f"request {how}", request, expected))
        elif how == "no lookups":
            request = fpb.StreamFeaturesRequest(id=request_id)
            requests.append(
                _stream_request("request with no lookups", request, INVALID, ("lookups",))
            )
        else:
            good = [_lookup(f) for f in draw(st.lists(fields, max_size=3))]
            index = draw(st.integers(0, len(good)))
            wrong, name = draw(bad[how])
            good.insert(index, _lookup(wrong))
            request = fpb.StreamFeaturesRequest(id=request_id, lookups=good)
            requests.append(
                _stream_request(
                    f"request with a lookup's {how}",
                    request,
                    INVALID,
                    (f"lookups[{index}].{name}",),
                )
            )
    ending = None
    end = draw(st.sampled_from(["none", "garbage", "bad UTF-8"]))
    if end == "garbage":
        raw = draw(st.binary(min_size=1, max_size=256))
        try:
            fpb.StreamFeaturesRequest.FromString(raw)
        except DecodeError:
            ending = Case(
                _ENDINGS["garbage"],
                STREAM_FEATURES,
                raw,
                INVALID,
                _field_names(fpb.StreamFeaturesRequest),
                timeout_s=5.0,
                streamed=True,
            )
    elif end == "bad UTF-8":
        lookup = _lookup(draw(fields)).SerializeToString() + _length_delimited(1, draw(_bad_utf8()))
        raw = fpb.StreamFeaturesRequest(id=99).SerializeToString() + _length_delimited(3, lookup)
        ending = Case(
            _ENDINGS["bad UTF-8"],
            STREAM_FEATURES,
            raw,
            INVALID,
            ("lookups[0].card_id",),
            timeout_s=5.0,
            streamed=True,
        )
    return Stream(STREAM_KIND, tuple(requests), ending)


# --- the scorer's repository (directly) ----------------------------------------------------


@dataclass(frozen=True)
class Repository:
    """What the scorer under test publishes."""

    model_name: str
    live: str
    candidate: str | None = None
    """A published version no traffic is routed to: loaded and unloaded by valid calls."""
    bait: tuple[str, ...] = ()
    """Path-like versions that lead to a complete version on disk (a sibling model's folder,
    a folder outside the repository, a symlink): a lookup of the path would find a model."""


_SEPARATED = st.builds(
    lambda a, sep, b: a + sep + b,
    st.text(max_size=12),
    st.sampled_from(["/", "\\", "/../", "..\\", "./"]),
    st.text(max_size=12),
)
_NOT_DIGITS = st.text(min_size=1, max_size=24).filter(lambda v: not (v.isascii() and v.isdigit()))


def _path_like_versions(bait: Sequence[str]) -> dict[str, st.SearchStrategy[str]]:
    """Versions that are not plain version numbers, by kind."""
    return {
        "with a separator": _SEPARATED | st.sampled_from(["1/", "/1", "1/../1", "1\\..", *bait]),
        "dot-dot": st.sampled_from(["..", "../1", "../..", "..\\1", ".", "./1", "1/.."]),
        "an absolute path": st.sampled_from(["/etc/passwd", "/", "/1", "//1", "C:\\1"])
        | st.text(max_size=30).map(lambda t: "/" + t),
        "with NUL": _wrapped(st.just("\x00")),
        "over-long": st.integers(repository.MAX_VERSION_DIGITS + 1, 20_000).map(lambda n: "1" * n)
        | st.text(min_size=repository.MAX_VERSION_DIGITS + 1, max_size=3000),
        "not digits": _NOT_DIGITS
        | st.sampled_from(["-1", "+1", " 1", "1 ", "1.0", "1e3", "0x1", "\u0661", "\u00b2"]),
        "with a leading zero": st.integers(0, 10**6).map(lambda n: f"0{n}"),
    }


def _path_like_names() -> st.SearchStrategy[str]:
    return (
        _SEPARATED
        | st.sampled_from(["..", ".", "../fraud-lgbm", "/etc", ".hidden", "-x", "a\x00b"])
        | st.text(min_size=repository.MAX_NAME_LENGTH + 1, max_size=2000)
        | st.text(min_size=1, max_size=30).filter(lambda n: repository.name_problem(n) is not None)
    )


def _load(
    method: str,
    name: str,
    parameters: Mapping[str, v2.ModelRepositoryParameter],
    repository_name: str = "",
) -> bytes:
    request_type = (
        v2.RepositoryModelLoadRequest
        if method == REPOSITORY_LOAD
        else v2.RepositoryModelUnloadRequest
    )
    request = request_type(repository_name=repository_name, model_name=name)
    for key, value in parameters.items():
        request.parameters[key].CopyFrom(value)
    return request.SerializeToString()


def _version_parameter(version: str | int) -> dict[str, v2.ModelRepositoryParameter]:
    if isinstance(version, int):
        return {"version": v2.ModelRepositoryParameter(int64_param=version)}
    return {"version": v2.ModelRepositoryParameter(string_param=version)}


def _both_ways(version: str) -> list[str | int]:
    """A version as a string and as an integer parameter."""
    return [version, int(version)]


def _config_parameter(versions: list[object]) -> dict[str, v2.ModelRepositoryParameter]:
    text = json.dumps({"version_policy": {"specific": {"versions": versions}}})
    return {"config": v2.ModelRepositoryParameter(string_param=text)}


def _infer(name: str, version: str) -> bytes:
    request = v2.ModelInferRequest(model_name=name, model_version=version)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(
        0.0
    )
    return request.SerializeToString()


def repository_suite(repo: Repository) -> Suite:
    """The scorer's repository RPCs, and the v2 RPCs that name a version (see the module doc)."""
    name = repo.model_name
    load_or_unload = st.sampled_from([REPOSITORY_LOAD, REPOSITORY_UNLOAD])
    published = {repo.live, *([repo.candidate] if repo.candidate else [])}
    unpublished = st.integers(0, 10**18 - 1).map(str).filter(lambda v: v not in published)

    def case(method: str, data: bytes, expected: frozenset[str], *fields: str) -> Case:
        return Case("", method, data, expected, tuple(fields), timeout_s=10.0)

    kinds: dict[str, st.SearchStrategy[Call]] = {
        "RepositoryModelLoad: the live version": st.sampled_from(_both_ways(repo.live)).map(
            lambda v: case(REPOSITORY_LOAD, _load(REPOSITORY_LOAD, name, _version_parameter(v)), OK)
        ),
        "RepositoryModelUnload: the live version": st.just(
            case(
                REPOSITORY_UNLOAD,
                _load(REPOSITORY_UNLOAD, name, _version_parameter(repo.live)),
                frozenset({"FAILED_PRECONDITION"}),
            )
        ),
        "RepositoryIndex: valid": st.booleans().map(
            lambda ready: case(
                REPOSITORY_INDEX, v2.RepositoryIndexRequest(ready=ready).SerializeToString(), OK
            )
        ),
        "Repository load/unload: a plain version not published": st.builds(
            lambda method, v: case(
                method, _load(method, name, _version_parameter(v)), frozenset({"NOT_FOUND"})
            ),
            load_or_unload,
            unpublished,
        ),
        "Repository load/unload: a plain model name not served": st.builds(
            lambda method, other: case(
                method,
                _load(method, other, _version_parameter(repo.live)),
                frozenset({"NOT_FOUND"}),
            ),
            load_or_unload,
            st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True).filter(lambda n: n != name),
        ),
        "Repository load/unload: a path-like model name": st.builds(
            lambda method, bad: case(
                method, _load(method, bad, _version_parameter(repo.live)), INVALID, "model_name"
            ),
            load_or_unload,
            _path_like_names() | st.just(""),
        ),
        "Repository load/unload/index: a path-like repository name": st.builds(
            lambda method, bad: case(
                method,
                v2.RepositoryIndexRequest(repository_name=bad).SerializeToString()
                if method == REPOSITORY_INDEX
                else _load(method, name, {}, repository_name=bad),
                INVALID,
                "repository_name",
            ),
            st.sampled_from([REPOSITORY_LOAD, REPOSITORY_UNLOAD, REPOSITORY_INDEX]),
            _path_like_names(),
        ),
        "Repository load/unload: a negative integer version": st.builds(
            lambda method, v: case(
                method, _load(method, name, _version_parameter(v)), INVALID, "parameters[version]"
            ),
            load_or_unload,
            st.integers(-(2**63), -1),
        ),
        "Repository load/unload: an unknown parameter": st.builds(
            lambda method, key: case(
                method,
                _load(method, name, {key: v2.ModelRepositoryParameter(bytes_param=b"\x00")}),
                INVALID,
                "parameters[",
            ),
            load_or_unload,
            st.sampled_from(["file:1/model.onnx", "file:../../x", "versions", ""])
            | st.text(max_size=40).filter(lambda k: k not in ("version", "config")),
        ),
        "Repository load/unload: a config that is not JSON": st.builds(
            lambda method, text: case(
                method,
                _load(method, name, {"config": v2.ModelRepositoryParameter(string_param=text)}),
                INVALID,
                "parameters[config]",
            ),
            load_or_unload,
            st.sampled_from(["{", "[" * 50_000, "{" * 20_000, "nan", ""])
            | st.text(max_size=30).filter(_not_json),
        ),
        "Repository load/unload: garbage bytes": st.builds(
            lambda method, raw: case(
                method, raw, INVALID, *_field_names(v2.RepositoryModelLoadRequest), "ready"
            ),
            st.sampled_from([REPOSITORY_LOAD, REPOSITORY_UNLOAD, REPOSITORY_INDEX]),
            st.binary(min_size=1, max_size=256).filter(_not_a_load_request),
        ),
    }
    if repo.candidate is not None:
        candidate = repo.candidate
        kinds["Repository load/unload: a published candidate"] = st.builds(
            lambda method, v: case(method, _load(method, name, _version_parameter(v)), OK),
            load_or_unload,
            st.sampled_from(_both_ways(candidate)),
        )
    for how, versions in _path_like_versions(repo.bait).items():
        kinds[f"Repository load/unload: a version {how}"] = st.builds(
            lambda method, v: case(
                method, _load(method, name, _version_parameter(v)), INVALID, "parameters[version]"
            ),
            load_or_unload,
            versions,
        )
        kinds[f"Repository load/unload: a config version {how}"] = st.builds(
            lambda method, v, first: case(
                method,
                _load(method, name, _config_parameter([*([repo.live] if first else []), v])),
                INVALID,
                f"parameters[config].version_policy.specific.versions[{1 if first else 0}]",
            ),
            load_or_unload,
            versions,
            st.booleans(),
        )
        kinds[f"ModelInfer/ModelReady/ModelMetadata: a version {how}"] = st.builds(
            lambda method, v: case(
                method,
                _infer(name, v)
                if method == MODEL_INFER
                else (v2.ModelReadyRequest if method == MODEL_READY else v2.ModelMetadataRequest)(
                    name=name, version=v
                ).SerializeToString(),
                INVALID,
                "model_version" if method == MODEL_INFER else "version",
            ),
            st.sampled_from([MODEL_INFER, MODEL_READY, MODEL_METADATA]),
            versions,
        )
    return Suite("repository", _named(kinds))


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _not_a_load_request(raw: bytes) -> bool:
    try:
        v2.RepositoryModelLoadRequest.FromString(raw)
        v2.RepositoryIndexRequest.FromString(raw)
    except DecodeError:
        return True
    return False


# --- sending ------------------------------------------------------------------------------


def _code_name(code: int) -> str:
    return code_pb2.Code.Name(code)


def _send_stream(channel: grpc.Channel, stream: Stream) -> list[Outcome]:
    """Sends a stream's requests (then its ending, if any) and matches replies to requests."""
    messages = [c.data for c in stream.requests]
    if stream.ending is not None:
        messages.append(stream.ending.data)
    call = channel.stream_stream(stream.requests[0].method if stream.requests else STREAM_FEATURES)
    timeout = max((c.timeout_s for c in stream.requests), default=5.0)
    replies: dict[int, fpb.StreamFeaturesResponse] = {}
    status, details = "OK", ""
    try:
        for raw in call(iter(messages), timeout=timeout):
            reply = fpb.StreamFeaturesResponse.FromString(raw)
            replies[reply.id] = reply
    except grpc.RpcError as error:
        status, details = error.code().name, error.details() or ""
    outcomes = []
    for case in stream.requests:
        found = replies.get(case.request_id)
        if found is not None:
            code = _code_name(found.error_code)
            outcomes.append(Outcome(case, code, found.error_message))
        elif status != "OK" and stream.ending is not None:
            # The stream ended on its bad message before this request's reply: not judged.
            continue
        else:
            outcomes.append(Outcome(case, status if status != "OK" else "NO REPLY", details))
    if stream.ending is not None:
        outcomes.append(Outcome(stream.ending, status, details))
    return outcomes


def send(channel: grpc.Channel, batch: Iterable[Call]) -> list[Outcome]:
    """Sends every unary call at once (bytes in, bytes out), then each stream, and collects
    the statuses."""
    calls = []
    streams = []
    for item in batch:
        if isinstance(item, Stream):
            streams.append(item)
            continue
        stub = channel.unary_unary(item.method)
        calls.append((item, stub.future(item.data, timeout=item.timeout_s)))
    outcomes = []
    for case, future in calls:
        try:
            future.result()
            outcomes.append(Outcome(case, "OK", ""))
        except grpc.RpcError as error:
            outcomes.append(Outcome(case, error.code().name, error.details() or ""))
    for stream in streams:
        outcomes.extend(_send_stream(channel, stream))
    return outcomes


def _send_alone(channel: grpc.Channel, case: Case) -> tuple[str, str]:
    if case.streamed:
        single = Stream(case.kind, (case,)) if case.request_id else Stream(case.kind, (), case)
        got = _send_stream(channel, single)
        return (got[-1].code, got[-1].details) if got else ("NO REPLY", "")
    outcome = send(channel, [case])[0]
    return outcome.code, outcome.details


def retry_late(channel: grpc.Channel, outcomes: list[Outcome]) -> list[Outcome]:
    """Re-sends alone, up to ``RETRIES`` times, each call answered late that must get another
    status; the answers are kept on its outcome."""
    result = []
    for outcome in outcomes:
        if outcome.late_first:
            retries: list[tuple[str, str]] = []
            while len(retries) < RETRIES:
                retries.append(_send_alone(channel, outcome.case))
                if retries[-1][0] != "DEADLINE_EXCEEDED":
                    break
            outcome = replace(outcome, retries=tuple(retries))
        result.append(outcome)
    return result


def run(
    target: str,
    suite: Suite,
    calls: int,
    random_seed: int | None = None,
    strict: bool = False,
) -> list[Outcome]:
    """Sends about ``calls`` generated calls of ``suite`` to ``target`` in rounds (one call
    of every kind, sent at once), then re-sends the late ones alone (``retry_late``). With no seed, hypothesis
    derandomizes (the same calls every run). ``strict`` fails a batch with a call whose
    status breaks its rules other than by being late (hypothesis then shrinks it to a small
    failing example)."""
    outcomes: list[Outcome] = []
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)

        @settings(
            max_examples=-(-calls // len(suite.kinds)),
            derandomize=random_seed is None,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(suite.round())
        def drive(batch: list[Call]) -> None:
            got = send(channel, batch)
            outcomes.extend(got)
            if strict:
                broken = [p for o in got if not o.late_first and (p := problem(o)) is not None]
                assert not broken, broken

        if random_seed is not None:
            drive = seed(random_seed)(drive)
        drive()
        return retry_late(channel, outcomes)


def summary(outcomes: Sequence[Outcome]) -> str:
    """Status counts by kind (first answers; late ones re-sent alone in brackets), as a
    Markdown table."""
    kinds = sorted({o.case.kind for o in outcomes})
    codes = sorted({o.code for o in outcomes} | {o.final[0] for o in outcomes})
    lines = ["| kind | calls | " + " | ".join(codes) + " |", "|---|---:|" + "---:|" * len(codes)]
    for kind in kinds:
        group = [o for o in outcomes if o.case.kind == kind]
        counts = Counter(o.code for o in group)
        retried = Counter(o.final[0] for o in group if o.retries)
        cells = [
            str(counts.get(c, 0)) + (f" ({retried[c]} on retry)" if retried.get(c) else "")
            for c in codes
        ]
        lines.append(f"| {kind} | {len(group)} | " + " | ".join(cells) + " |")
    total = Counter(o.code for o in outcomes)
    lines.append(
        f"| **all** | **{len(outcomes)}** | "
        + " | ".join(f"**{total.get(c, 0)}**" for c in codes)
        + " |"
    )
    return "\n".join(lines)


@dataclass
class Report:
    """Every suite's outcomes from one run, and what broke."""

    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    baseline: float = 0.0

    def problems(self) -> list[str]:
        """Broken rules across the suites."""
        found = []
        for outcomes in self.outcomes.values():
            found.extend(judge(outcomes, self.baseline))
        return found


def main(argv: Sequence[str] | None = None) -> int:
    """Starts a mesh (or targets one), sends the hostile calls, prints the counts; exit 1 on
    any forbidden status or broken expectation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument(
        "--calls", type=int, default=5000, help="Score calls; other suites 1/5 of it"
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)

    sample = data.sample_population(FeatureStoreSettings(var_dir=args.var_dir).data_path, 200)
    population = Population(
        card_ids=[t.card_id for t in sample], merchant_ids=[t.merchant_id for t in sample]
    )
    config = MeshConfig.on_free_ports(
        var_dir=args.var_dir,
        log_dir=args.var_dir / "logs" / f"hostile-{args.seed}",
        rate_limit_rps=100_000,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=180)
    report = Report()
    try:
        started = time.monotonic()
        models = config.var_dir / "models"
        name = repository.DEFAULT_MODEL_NAME
        live = repository.latest_version(models, name) or "1"
        host = config.host
        suites = [
            (config.envoy_target, score_suite(population), args.calls),
            (config.envoy_target, outcome_suite(), args.calls // 5),
            (f"{host}:{config.features_port}", features_suite(population), args.calls // 5),
            (f"{host}:{config.features_port}", stream_suite(population), args.calls // 15),
            (
                f"{host}:{config.scorer_port}",
                repository_suite(Repository(name, live)),
                args.calls // 5,
            ),
        ]
        for target, suite, calls in suites:
            report.outcomes[suite.name] = run(target, suite, calls, random_seed=args.seed)
        report.baseline = baseline_late_share(report.outcomes["score"])
        took = time.monotonic() - started
        after = client.Sample("after", population.card_ids[0], population.merchant_ids[0], 1500)
        answer = client.score(config.envoy_target, after.request(), 1.0)
    finally:
        mesh.stop()
    total = sum(len(o) for o in report.outcomes.values())
    print(f"{total} calls in {took:.1f} s (seed {args.seed})\n")
    for name, outcomes in report.outcomes.items():
        print(f"### {name}\n\n{summary(outcomes)}\n")
    decision = client.DECISION_NAMES.get(answer.decision)
    print(f"afterwards a valid call: {decision}, scored by {client.scored_by(answer)}")
    problems = report.problems()
    for found in problems[:20]:
        print("problem:", found)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
