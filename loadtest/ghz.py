"""A small wrapper around the ghz gRPC load generator: build the command, run it, parse its JSON.

``run_ghz`` always runs open loop (``--async``: calls are sent on the rate ticker whatever
the answers do, so queueing shows up as latency instead of a lower send rate) and counts
errors in the latency figures (``--count-errors``). Every run is bounded: by ``total`` calls
or by ``duration``, whichever comes first.

Percentiles are computed here from ghz's per-call ``details`` (every call's latency and
status; ghz keeps up to a million of them), not from its ``latencyDistribution``, which
stops at p99 and leaves errors out. That gives p50/p90/p99/p99.9 on the same footing; with
fewer than 1,000 calls p99.9 is simply the slowest call.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from services.domain import metrics

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository root (proto files and ghz configs are found relative to it)."""

PROTO_ROOT = REPO_ROOT / "protos"
"""Import path of the project's proto files."""


class GhzNotFoundError(FileNotFoundError):
    """ghz is on neither PATH nor ``$(go env GOPATH)/bin``."""


def find_ghz() -> str:
    """Path of the ghz binary: PATH first, then Go's install folder; raises if absent."""
    found = shutil.which("ghz")
    if found:
        return found
    gopath = os.environ.get("GOPATH") or _go_env_gopath() or str(Path.home() / "go")
    for folder in gopath.split(os.pathsep):
        candidate = Path(folder) / "bin" / "ghz"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise GhzNotFoundError(
        "ghz not found on PATH or in $(go env GOPATH)/bin: install it with "
        "`go install github.com/bojand/ghz/cmd/ghz@v0.121.0` (or `make tools`)"
    )


def _go_env_gopath() -> str | None:
    go = shutil.which("go")
    if go is None:
        return None
    try:
        out = subprocess.run(
            [go, "env", "GOPATH"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@dataclass(frozen=True)
class Call:
    """One gRPC method ghz drives, with the proto file that describes it."""

    method: str
    """Fully qualified method, e.g. ``fraud.v1.FraudScoring.Score``."""
    proto: Path
    """The .proto file declaring the service (imports resolved under ``PROTO_ROOT``)."""


SCORE = Call("fraud.v1.FraudScoring.Score", PROTO_ROOT / "fraud" / "v1" / "scoring.proto")
"""The public API, normally through Envoy."""
GET_FEATURES = Call(
    "fraud.v1.FeatureService.GetFeatures", PROTO_ROOT / "fraud" / "v1" / "features.proto"
)
"""The feature service, called directly."""
MODEL_INFER = Call(
    "inference.GRPCInferenceService.ModelInfer", PROTO_ROOT / "inference" / "grpc_predict_v2.proto"
)
"""The scorer (or any Open Inference Protocol v2 server), called directly."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call of a run, from ghz's ``details``."""

    started_s: float
    """Wall-clock time (seconds since the epoch) the call was sent: ghz stamps a call when
    it ends, so this is that stamp less the latency."""
    latency_ms: float
    status: str
    """gRPC status name (``OK``, ``DeadlineExceeded``, …)."""


@dataclass(frozen=True)
class Result:
    """What one ghz run measured. Latencies in milliseconds, shares in 0..1."""

    offered_rps: float
    """The rate ghz was asked to send at (0 when unbounded)."""
    achieved_rps: float
    """Calls answered (OK or not) per second of wall time."""
    count: int
    """Calls made."""
    duration_s: float
    """Wall time of the run."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    mean_ms: float
    status_counts: Mapping[str, int] = field(default_factory=dict)
    """Calls by gRPC status name (``OK``, ``DeadlineExceeded``, …)."""
    errors: Mapping[str, int] = field(default_factory=dict)
    """Distinct error messages and how often each came."""
    status_p99_ms: Mapping[str, float] = field(default_factory=dict)
    """p99 latency of the calls of each status (e.g. of the OK ones alone)."""
    calls: Sequence[CallRecord] = field(default=(), repr=False, compare=False)
    """Every call, in the order ghz reported them (empty when the report had no details)."""

    @property
    def error_count(self) -> int:
        """Calls that did not end OK."""
        return sum(n for code, n in self.status_counts.items() if code != "OK")

    @property
    def error_share(self) -> float:
        """Share of calls that did not end OK."""
        return self.error_count / self.count if self.count else 0.0

    def error_shares(self) -> dict[str, float]:
        """Share of calls per non-OK status code."""
        if not self.count:
            return {}
        return {
            code: n / self.count for code, n in sorted(self.status_counts.items()) if code != "OK"
        }

    def ok(self, p99_ms: float) -> bool:
        """True when the run had no errors and its p99 is within ``p99_ms``."""
        return self.count > 0 and self.error_count == 0 and self.p99_ms <= p99_ms

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "offered_rps": self.offered_rps,
            "achieved_rps": round(self.achieved_rps, 1),
            "count": self.count,
            "duration_s": round(self.duration_s, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.p90_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "p999_ms": round(self.p999_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "mean_ms": round(self.mean_ms, 3),
            "error_share": self.error_share,
            "status_counts": dict(self.status_counts),
            # Per status: a refusal's latency is judged apart from an answer's.
            "status_p99_ms": {k: round(v, 3) for k, v in self.status_p99_ms.items()},
            "errors": dict(self.errors),
        }


def parse_report(report: Mapping[str, Any], offered_rps: float = 0.0) -> Result:
    """A Result from ghz's JSON report (``--format json``); latencies there are nanoseconds."""
    details = report.get("details") or []
    latencies = sorted(d["latency"] / 1e6 for d in details)
    statuses: Counter[str] = Counter(report.get("statusCodeDistribution") or {})
    if not statuses and details:
        statuses = Counter(d.get("status") or "OK" for d in details)
    by_status: dict[str, list[float]] = {}
    for d in details:
        by_status.setdefault(d.get("status") or "OK", []).append(d["latency"] / 1e6)
    calls = tuple(_call_record(d) for d in details if d.get("timestamp"))
    count = int(report.get("count") or len(details))
    total_ns = float(report.get("total") or 0)
    p50, p90, p99, p999 = metrics.percentiles(latencies, (50, 90, 99, 99.9), empty=0.0)
    return Result(
        offered_rps=offered_rps,
        achieved_rps=count / (total_ns / 1e9) if total_ns else 0.0,
        count=count,
        duration_s=total_ns / 1e9,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        p999_ms=p999,
        max_ms=latencies[-1] if latencies else 0.0,
        mean_ms=sum(latencies) / len(latencies) if latencies else 0.0,
        status_counts=dict(statuses),
        errors=dict(report.get("errorDistribution") or {}),
        status_p99_ms={k: metrics.percentile(v, 99) for k, v in by_status.items()},
        calls=calls,
    )


def _call_record(detail: Mapping[str, Any]) -> CallRecord:
    """A CallRecord from one entry of ghz's ``details`` (RFC 3339 end stamp, nanoseconds)."""
    latency_ms = detail["latency"] / 1e6
    # Python keeps microseconds of ghz's nanosecond stamp: plenty for windows of seconds.
    ended = datetime.fromisoformat(detail["timestamp"]).timestamp()
    return CallRecord(ended - latency_ms / 1000.0, latency_ms, detail.get("status") or "OK")


def default_connections(rps: float) -> int:
    """HTTP/2 connections for a rate: one per ~500 rps (at least 1, at most 4).

    One connection carries many concurrent streams; a few spread the load over the
    server's completion queues without making ghz the bottleneck on a small machine.
    """
    return max(1, min(4, math.ceil(rps / 500)))


def default_concurrency(rps: float, connections: int) -> int:
    """ghz workers for an open-loop rate: enough to pick up every tick, a multiple of
    ``connections``. In async mode each tick becomes its own goroutine, so workers only
    dispatch; they do not bound the calls in flight."""
    workers = max(4, math.ceil(rps / 100))
    return math.ceil(workers / connections) * connections


def ghz_command(
    call: Call,
    target: str,
    data_file: Path,
    *,
    rps: int,
    total: int | None = None,
    duration_s: float | None = None,
    timeout_ms: float = 1000.0,
    connections: int | None = None,
    concurrency: int | None = None,
    config: Path | None = None,
    extra_args: Sequence[str] = (),
    ghz: str | None = None,
) -> list[str]:
    """The ghz argv for one bounded open-loop run (JSON report on standard output)."""
    if total is None and duration_s is None:
        raise ValueError("bound the run: give total, duration_s or both")
    if rps < 1:
        raise ValueError(f"rps must be at least 1, got {rps}")
    conns = connections or default_connections(rps)
    workers = concurrency or default_concurrency(rps, conns)
    argv = [ghz or find_ghz()]
    if config is not None:
        argv += ["--config", str(config)]
    argv += [
        "--insecure",
        "--proto",
        str(call.proto),
        "--import-paths",
        str(PROTO_ROOT),
        "--call",
        call.method,
        "--data-file",
        str(data_file),
        "--async",
        "--count-errors",
        "--rps",
        str(rps),
        "--connections",
        str(conns),
        "--concurrency",
        str(workers),
        "--timeout",
        f"{timeout_ms:g}ms",
        "--format",
        "json",
    ]
    if total is not None:
        argv += ["--total", str(total)]
    else:
        # ghz's --total defaults to 200; a duration-bounded run must not stop there.
        argv += ["--total", str(max(1, math.ceil(rps * (duration_s or 0) * 1.5)))]
    if duration_s is not None:
        # "wait": calls still in flight when the time is up finish and are counted.
        argv += ["--duration", f"{duration_s:g}s", "--duration-stop", "wait"]
    argv += list(extra_args)
    argv.append(target)
    return argv


def run_ghz(
    call: Call,
    target: str,
    data_file: Path,
    *,
    rps: int,
    total: int | None = None,
    duration_s: float | None = None,
    timeout_ms: float = 1000.0,
    connections: int | None = None,
    concurrency: int | None = None,
    config: Path | None = None,
    extra_args: Sequence[str] = (),
    raw_output: Path | None = None,
    ghz: str | None = None,
) -> Result:
    """Runs ghz open loop at ``rps`` against ``target`` and returns what it measured.

    ``data_file`` is a ghz data file (a JSON array of request messages, sent round robin;
    see ``loadtest.data``). The run stops after ``total`` calls or ``duration_s`` seconds.
    ``timeout_ms`` is each call's deadline (sent as grpc-timeout). ``raw_output`` keeps
    ghz's full JSON report. Raises RuntimeError when ghz itself fails.
    """
    argv = ghz_command(
        call,
        target,
        data_file,
        rps=rps,
        total=total,
        duration_s=duration_s,
        timeout_ms=timeout_ms,
        connections=connections,
        concurrency=concurrency,
        config=config,
        extra_args=extra_args,
        ghz=ghz,
    )
    limit = (duration_s or (total or 0) / rps) + 60
    with tempfile.TemporaryFile() as out:
        completed = subprocess.run(
            argv, stdout=out, stderr=subprocess.PIPE, timeout=limit, check=False, cwd=REPO_ROOT
        )
        out.seek(0)
        text = out.read()
    if completed.returncode != 0 or not text.strip():
        raise RuntimeError(
            f"ghz exited with {completed.returncode}: "
            f"{completed.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    report = json.loads(text)
    if raw_output is not None:
        raw_output.parent.mkdir(parents=True, exist_ok=True)
        raw_output.write_bytes(text)
    return parse_report(report, offered_rps=float(rps))
