"""Hostile traffic for the public API: generated requests, valid and not, through Envoy.

``cases`` is a hypothesis strategy of ``Case``: the bytes of one call (sent with a
bytes-level stub, so they need not be a message at all), its deadline, and the statuses
it may get. The kinds:

- **valid**: a plausible transaction (OK, or shed / late on a saturated machine);
- **invalid**: a valid transaction with exactly one field made invalid: empty, long or
  control-character ids, negative or extreme amounts, unknown currencies, missing,
  future, stale or out-of-range timestamps, unknown channels (INVALID_ARGUMENT naming it);
- **odd text**: valid UTF-8 that is unusual (control, format and private-use characters,
  emoji, combining marks, right-to-left text) in a string field (OK or INVALID_ARGUMENT);
- **bad UTF-8**: invalid UTF-8 bytes in one string field (INVALID_ARGUMENT naming it);
- **garbage** and **truncated**: random bytes, and valid requests cut short;
- **oversized**: a field of tens to hundreds of kilobytes (RESOURCE_EXHAUSTED);
- **tiny deadline**: a valid request with a sub-millisecond to few-millisecond deadline;
- **health garbage**: random bytes to grpc.health.v1.Health/Check.

INTERNAL, UNKNOWN and UNAVAILABLE are never acceptable. ``tests/integration/
test_hostile_input.py`` drives these through a mesh in ``make test``; ``python -m
loadtest.hostile`` runs a longer, randomly seeded batch and prints the status counts.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fraud.v1 import scoring_pb2 as pb
from loadtest import data
from services import client
from services.domain import money
from services.domain.validation import MAX_ID_LENGTH
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig

SCORE = "/fraud.v1.FraudScoring/Score"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"

FORBIDDEN = frozenset({"INTERNAL", "UNKNOWN", "UNAVAILABLE"})
"""Statuses hostile input must never get."""

ANSWERED = frozenset({"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})
"""What a valid call may get: an answer, or shed / late when the machine is saturated."""

MAX_DETAILS = 600
"""Longest status message accepted back: echoed values are capped."""

STRING_FIELDS = {
    "transaction_id": 1,
    "card_id": 2,
    "merchant_id": 3,
    "currency": 5,
    "terminal_id": 7,
}
"""ScoreRequest's string fields and their numbers."""

CURRENCIES = ("EUR", "USD", "GBP", "JPY", "CHF")
"""Currencies of valid requests (small amounts in each stay under the amount limit)."""


@dataclass(frozen=True)
class Case:
    """One call: what is sent, and what may come back."""

    kind: str
    method: str
    data: bytes
    timeout_s: float
    expected: frozenset[str]
    field: str | None = None
    """For INVALID_ARGUMENT: the field the message must start with."""


@dataclass(frozen=True)
class Outcome:
    """What one call got."""

    case: Case
    code: str
    details: str

    def problem(self) -> str | None:
        """Why the outcome breaks the rules, or None."""
        if self.code in FORBIDDEN or self.code not in self.case.expected:
            return f"{self.case.kind}: got {self.code} ({self.details[:120]!r})"
        if len(self.details) > MAX_DETAILS:
            return f"{self.case.kind}: status message of {len(self.details)} characters"
        if (
            self.code == "INVALID_ARGUMENT"
            and self.case.field is not None
            and not self.details.startswith(self.case.field)
        ):
            return f"{self.case.kind}: {self.details[:120]!r} does not name {self.case.field}"
        return None


@dataclass(frozen=True)
class Population:
    """Entities valid requests use; unknown ones are fine too (default features)."""

    card_ids: Sequence[str]
    merchant_ids: Sequence[str]

    def __repr__(self) -> str:
        # Short: hypothesis prints strategies (with this as an argument) in its reports.
        return f"Population({len(self.card_ids)} cards, {len(self.merchant_ids)} merchants)"


def _request(fields: dict[str, object]) -> pb.ScoreRequest:
    return pb.ScoreRequest(**fields)  # type: ignore[arg-type]


@st.composite
def _valid_fields(draw: st.DrawFn, population: Population) -> dict[str, object]:
    # Strategies must not depend on the clock (hypothesis replays them): draw an offset.
    stamp = time.time() + draw(st.floats(-6 * 86_400, 60))
    return {
        "transaction_id": "h-" + draw(st.text("abcdef0123456789", min_size=8, max_size=24)),
        "card_id": draw(st.sampled_from(population.card_ids)),
        "merchant_id": draw(st.sampled_from(population.merchant_ids)),
        "amount_minor": draw(st.integers(0, 50_000)),  # 0: an account verification
        "currency": draw(st.sampled_from(CURRENCIES)),
        "timestamp": Timestamp(seconds=int(stamp), nanos=draw(st.integers(0, 999_999_999))),
        "terminal_id": draw(st.sampled_from(["", "term-0001", "T" * MAX_ID_LENGTH])),
        "channel": draw(st.sampled_from([0, 1, 2])),
    }


_CONTROL = st.sampled_from(["\x00", "\n", "\r\n", "\x1b[31m", "\u2028", "\x7f"])


def _bad_id(draw: st.DrawFn, required: bool) -> str:
    options = [
        st.text(min_size=MAX_ID_LENGTH + 1, max_size=MAX_ID_LENGTH + 2000),
        st.builds(lambda a, c, b: a + c + b, st.text(max_size=10), _CONTROL, st.text(max_size=10)),
    ]
    if required:
        options.append(st.just(""))
    return str(draw(st.one_of(options)))


@st.composite
def _invalid(draw: st.DrawFn, population: Population) -> Case:
    fields = draw(_valid_fields(population))
    now = int(time.time())
    field = draw(
        st.sampled_from(
            [
                "transaction_id",
                "card_id",
                "merchant_id",
                "terminal_id",
                "amount_minor",
                "currency",
                "timestamp",
                "channel",
            ]
        )
    )
    if field in ("transaction_id", "card_id", "merchant_id"):
        fields[field] = _bad_id(draw, required=True)
    elif field == "terminal_id":
        fields[field] = _bad_id(draw, required=False)
    elif field == "amount_minor":
        fields["currency"] = "EUR"
        fields[field] = draw(
            st.one_of(
                st.integers(-(2**63), -1),
                st.integers(100_000_001, 2**63 - 1),
                st.sampled_from([-1, -(2**63), 2**63 - 1]),
            )
        )
    elif field == "currency":
        fields[field] = draw(
            st.text(max_size=12).filter(lambda c: not money.is_known(c))
            | st.sampled_from(["eur", "EURO", "XXX1", "", " EUR"])
        )
    elif field == "timestamp":
        how = draw(st.sampled_from(["missing", "future", "stale", "out of range", "nanos"]))
        if how == "missing":
            del fields["timestamp"]
        elif how == "future":
            ahead = draw(st.integers(3_600, 10**12))
            fields["timestamp"] = Timestamp(seconds=min(now + ahead, 253_402_300_799))
        elif how == "stale":
            behind = draw(st.integers(8 * 86_400, 10**12))
            fields["timestamp"] = Timestamp(seconds=max(now - behind, -62_135_596_800))
        elif how == "out of range":
            fields["timestamp"] = Timestamp(
                seconds=draw(
                    st.integers(-(2**63), -62_135_596_801) | st.integers(253_402_300_800, 2**63 - 1)
                )
            )
        else:
            fields["timestamp"] = Timestamp(
                seconds=now,
                nanos=draw(st.integers(-(2**31), -1) | st.integers(10**9, 2**31 - 1)),
            )
    else:
        fields[field] = draw(st.one_of(st.integers(3, 2**31 - 1), st.integers(-(2**31), -1)))
    data = _request(fields).SerializeToString()
    return Case("invalid", SCORE, data, 2.0, frozenset({"INVALID_ARGUMENT"}) | _LATE, field)


_LATE = frozenset({"DEADLINE_EXCEEDED"})
"""Allowed beside the expected status: Envoy ends calls a saturated machine answers late."""

_ODD_TEXT = st.text(
    alphabet=st.characters(categories=["Cc", "Cf", "Co", "Mn", "So", "Zs", "Lo", "Nd"]),
    min_size=1,
    max_size=40,
)


@st.composite
def _odd_text(draw: st.DrawFn, population: Population) -> Case:
    fields = draw(_valid_fields(population))
    field = draw(st.sampled_from(sorted(STRING_FIELDS)))
    fields[field] = draw(_ODD_TEXT)
    data = _request(fields).SerializeToString()
    return Case("odd text", SCORE, data, 2.0, frozenset({"OK", "INVALID_ARGUMENT"}) | ANSWERED)


def _length_delimited(number: int, raw: bytes) -> bytes:
    """A length-delimited field ``number`` (< 16) holding ``raw``, as the wire has it."""
    length = len(raw)
    prefix = bytearray([number << 3 | 2])
    while True:
        byte, length = length & 0x7F, length >> 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(prefix) + raw


_INVALID_UTF8 = st.sampled_from(
    [
        b"\xff",
        b"\xc3\x28",
        b"\xa0\xa1",
        b"\xe2\x28\xa1",
        b"\xf0\x28\x8c\xbc",
        b"\xed\xa0\x80",
        b"\xc0\xaf",
    ]
)


@st.composite
def _bad_utf8(draw: st.DrawFn, population: Population) -> Case:
    fields = draw(_valid_fields(population))
    field = draw(st.sampled_from(sorted(STRING_FIELDS)))
    raw = draw(st.binary(max_size=8)) + draw(_INVALID_UTF8) + draw(st.binary(max_size=8))
    # The last occurrence of a field wins, so appending it replaces the valid value.
    data = _request(fields).SerializeToString() + _length_delimited(STRING_FIELDS[field], raw)
    return Case("bad UTF-8", SCORE, data, 2.0, frozenset({"INVALID_ARGUMENT"}) | _LATE, field)


@st.composite
def _truncated(draw: st.DrawFn, population: Population) -> Case:
    data = _request(draw(_valid_fields(population))).SerializeToString()
    cut = draw(st.integers(0, len(data) - 1))
    return Case(
        "truncated", SCORE, data[:cut], 2.0, frozenset({"OK", "INVALID_ARGUMENT"}) | ANSWERED
    )


@st.composite
def _oversized(draw: st.DrawFn, population: Population, limit: int) -> Case:
    fields = draw(_valid_fields(population))
    field = draw(st.sampled_from(sorted(STRING_FIELDS)))
    fields[field] = draw(st.sampled_from("xé€😀")) * draw(st.integers(limit, 16 * limit))
    data = _request(fields).SerializeToString()
    return Case("oversized", SCORE, data, 2.0, frozenset({"RESOURCE_EXHAUSTED"}) | _LATE)


def cases(population: Population, max_request_bytes: int = 16 * 1024) -> st.SearchStrategy[Case]:
    """Every kind of hostile call, valid ones among them (see the module doc)."""
    valid = _valid_fields(population).map(
        lambda f: Case("valid", SCORE, _request(f).SerializeToString(), 2.0, ANSWERED)
    )
    tiny_deadline = st.builds(
        lambda f, t: Case("tiny deadline", SCORE, _request(f).SerializeToString(), t, ANSWERED),
        _valid_fields(population),
        st.floats(0.0001, 0.003),
    )
    garbage = st.binary(min_size=1, max_size=512).map(
        lambda b: Case("garbage", SCORE, b, 2.0, frozenset({"INVALID_ARGUMENT"}) | _LATE)
    )
    health = st.binary(max_size=64).map(
        lambda b: Case(
            "health garbage",
            HEALTH_CHECK,
            b,
            2.0,
            frozenset({"OK", "INVALID_ARGUMENT", "NOT_FOUND"}) | _LATE,
        )
    )
    return st.one_of(
        valid,
        _invalid(population),
        _odd_text(population),
        _bad_utf8(population),
        garbage,
        _truncated(population),
        _oversized(population, max_request_bytes),
        tiny_deadline,
        health,
    )


def send(channel: grpc.Channel, batch: Iterable[Case]) -> list[Outcome]:
    """Sends every case at once (bytes in, bytes out) and collects the statuses."""
    calls = []
    for case in batch:
        stub = channel.unary_unary(case.method)
        calls.append((case, stub.future(case.data, timeout=case.timeout_s)))
    outcomes = []
    for case, future in calls:
        try:
            future.result()
            outcomes.append(Outcome(case, "OK", ""))
        except grpc.RpcError as error:
            code = error.code()
            outcomes.append(Outcome(case, code.name, error.details() or ""))
    return outcomes


def run(
    target: str,
    population: Population,
    calls: int,
    batch_size: int = 25,
    random_seed: int | None = None,
    max_request_bytes: int = 16 * 1024,
    strict: bool = False,
) -> list[Outcome]:
    """Sends about ``calls`` generated calls to ``target`` in concurrent batches; with no
    seed, hypothesis derandomizes (the same calls every run). ``strict`` fails a batch
    with a broken expectation (hypothesis then shrinks it to a small failing example)."""
    outcomes: list[Outcome] = []
    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)

        @settings(
            max_examples=-(-calls // batch_size),
            derandomize=random_seed is None,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            st.lists(cases(population, max_request_bytes), min_size=batch_size, max_size=batch_size)
        )
        def drive(batch: list[Case]) -> None:
            got = send(channel, batch)
            outcomes.extend(got)
            if strict:
                problems = [p for o in got if (p := o.problem()) is not None]
                assert not problems, problems

        if random_seed is not None:
            drive = seed(random_seed)(drive)
        drive()
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> str:
    """Status counts overall and by kind, as a Markdown table."""
    kinds = sorted({o.case.kind for o in outcomes})
    codes = sorted({o.code for o in outcomes})
    lines = ["| kind | " + " | ".join(codes) + " |", "|---|" + "---:|" * len(codes)]
    for kind in kinds:
        counts = Counter(o.code for o in outcomes if o.case.kind == kind)
        lines.append(f"| {kind} | " + " | ".join(str(counts.get(c, 0)) for c in codes) + " |")
    total = Counter(o.code for o in outcomes)
    lines.append("| **all** | " + " | ".join(f"**{total.get(c, 0)}**" for c in codes) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Starts a mesh (or targets one), sends the hostile calls, prints the counts; exit 1 on
    any forbidden status or broken expectation."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--target", help="host:port of a running Envoy; default starts a mesh")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)

    sample = data.sample_population(FeatureStoreSettings(var_dir=args.var_dir).data_path, 200)
    population = Population(
        card_ids=[t.card_id for t in sample], merchant_ids=[t.merchant_id for t in sample]
    )
    mesh = None
    target = args.target
    if target is None:
        config = MeshConfig.on_free_ports(
            var_dir=args.var_dir,
            log_dir=args.var_dir / "logs" / f"hostile-{args.seed}",
            rate_limit_rps=100_000,
        )
        mesh = Mesh(config)
        mesh.start(timeout_s=180)
        target = config.envoy_target
    try:
        started = time.monotonic()
        outcomes = run(target, population, args.calls, random_seed=args.seed)
        took = time.monotonic() - started
        after = client.Sample("after", population.card_ids[0], population.merchant_ids[0], 1500)
        answer = client.score(target, after.request(), 1.0)
    finally:
        if mesh is not None:
            mesh.stop()
    problems = [p for o in outcomes if (p := o.problem()) is not None]
    print(f"{len(outcomes)} calls in {took:.1f} s (seed {args.seed})\n")
    print(summary(outcomes))
    decision = client.DECISION_NAMES.get(answer.decision)
    print(f"\nafterwards a valid call: {decision}, scored by {client.scored_by(answer)}")
    for problem in problems[:20]:
        print("problem:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
