"""When does the gateway emit its decision event? Measured, not assumed.

A Score server on the project's runtime (``services.common.server``) answers a canned
ScoreResponse and emits the real decision event (``gateway.events.EventEmitter`` onto a
file log) with one of four strategies:

- ``off``: no event (the floor);
- ``inline``: build and append before returning the response;
- ``call_soon``: ``loop.call_soon`` before returning (runs on the loop's next turn, while
  grpc finishes the call);
- ``done_callback``: ``context.add_done_callback`` (grpc runs it once the call's final
  batch, response and status, has completed).

ghz drives each strategy open loop at each rate; strategies alternate and every cell is the
median of ``--repeats`` runs (the machine is shared). ``--extra-us`` adds that much busy
work to every emit, so that whether the answer waits for the emit shows in the latency and
not only in the CPU: with 2000 µs extra, a strategy that runs before the answer leaves adds
~2 ms to every call.

    python -m loadtest.emit_bench [--rates 200,400] [--seconds 10] [--repeats 3] [--extra-us 0]

Results go to ``loadtest/results/emit-strategies[-extra<N>us].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import grpc
import psutil

from fraud.v1 import scoring_pb2, scoring_pb2_grpc
from loadtest import ghz, provenance
from loadtest.data import write_data_file
from loadtest.priority import normal_priority
from loadtest.runner import RESULTS_DIR, machine_line
from services.common.server import serve
from services.common.settings import ServerSettings
from services.domain import featurespec
from services.eventlog import EventLogSettings, open_producer
from services.gateway.events import EventEmitter
from services.gateway.metrics import GatewayMetrics
from services.gateway.pipeline import Decision, ScoredBy, ScoreResult, Source
from services.mesh import Process, free_port, grpc_serving

STRATEGIES = ("off", "inline", "call_soon", "done_callback")


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


class BenchServicer(scoring_pb2_grpc.FraudScoringServicer):
    """Answers a canned decision and emits its event with one strategy."""

    def __init__(self, strategy: str, emitter: EventEmitter, extra_us: float) -> None:
        self._strategy = strategy
        self._emitter = emitter
        self._extra_us = extra_us
        self._result = ScoreResult(
            Decision.APPROVE,
            0.01,
            ["model score 0.010 < review threshold 0.095"],
            "1",
            ScoredBy.MODEL,
            Source.ONLINE,
            features=[0.5] * len(featurespec.MODEL_FEATURES),
            feature_order=featurespec.MODEL_FEATURES,
        )

    def _emit(self, request: scoring_pb2.ScoreRequest, response: scoring_pb2.ScoreResponse,
              decided_at_s: float, _context: object = None) -> None:  # fmt: skip
        self._emitter.decision(request, True, self._result, response, decided_at_s)
        if self._extra_us:
            _spin(self._extra_us)

    async def Score(
        self, request: scoring_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> scoring_pb2.ScoreResponse:
        response = scoring_pb2.ScoreResponse(
            transaction_id=request.transaction_id,
            decision=scoring_pb2.DECISION_APPROVE,
            score=0.01,
            reasons=self._result.reasons,
            model_version="1",
            scored_by=scoring_pb2.SCORED_BY_MODEL,
            feature_source=scoring_pb2.FEATURE_SOURCE_ONLINE,
            elapsed_ms=0.5,
        )
        strategy = self._strategy
        if strategy == "inline":
            self._emit(request, response, time.time())
        elif strategy == "call_soon":
            asyncio.get_running_loop().call_soon(self._emit, request, response, time.time())
        elif strategy == "done_callback":
            context.add_done_callback(functools.partial(self._emit, request, response, time.time()))
        return response


class BenchService:
    """The bench server as a ``services.common.server.Service``."""

    name = "emit-bench"

    def __init__(self, strategy: str, var_dir: Path, extra_us: float) -> None:
        events = EventLogSettings(var_dir=var_dir, groups=())
        producer = open_producer(events) if strategy != "off" else None
        self.emitter = EventEmitter(producer, featurespec.MODEL_FEATURES, GatewayMetrics())
        self.servicer = BenchServicer(strategy, self.emitter, extra_us)

    def register(self, server: grpc.aio.Server) -> list[str]:
        """Adds the Score servicer."""
        scoring_pb2_grpc.add_FraudScoringServicer_to_server(self.servicer, server)
        return ["fraud.v1.FraudScoring"]

    async def start(self) -> None:
        """Nothing to load."""

    async def close(self) -> None:
        """Delivers the buffered events."""
        await self.emitter.close()


def _serve(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=STRATEGIES, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--var-dir", type=Path, required=True)
    parser.add_argument("--extra-us", type=float, default=0.0)
    args = parser.parse_args(argv)
    settings = ServerSettings(port=args.port, drain_seconds=0, log_json=False, log_level="WARNING")
    serve(settings, BenchService(args.strategy, args.var_dir, args.extra_us))


def _requests(path: Path) -> Path:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return write_data_file(
        path,
        [
            {
                "transaction_id": f"bench-{i}-{{{{.RequestNumber}}}}",
                "card_id": f"card-{i:06d}",
                "merchant_id": f"merch-{i % 300:05d}",
                "amount_minor": str(1000 + i),
                "currency": "EUR",
                "timestamp": stamp,
                "channel": "CHANNEL_CARD_NOT_PRESENT",
            }
            for i in range(500)
        ],
    )


def measure(
    strategy: str, rps: int, seconds: float, extra_us: float, work: Path
) -> tuple[ghz.Result, float]:
    """One run: start a server, drive it with ghz, return ghz's result and the server's CPU
    milliseconds per call."""
    port = free_port()
    process = Process(
        f"emit-{strategy}",
        [
            sys.executable, "-m", "loadtest.emit_bench", "serve", "--strategy", strategy,
            "--port", str(port), "--var-dir", str(work / strategy), "--extra-us", str(extra_us),
        ],
        ready=lambda: grpc_serving(f"127.0.0.1:{port}"),
        log_path=work / f"{strategy}.log",
    )  # fmt: skip
    process.start()
    try:
        process.wait_ready(60)
        assert process.pid is not None
        normal_priority([process.pid])
        data = _requests(work / "requests.json")
        target = f"127.0.0.1:{port}"
        ghz.run_ghz(ghz.SCORE, target, data, rps=rps, duration_s=2.0, timeout_ms=1000)
        proc = psutil.Process(process.pid)
        before = proc.cpu_times()
        result = ghz.run_ghz(ghz.SCORE, target, data, rps=rps, duration_s=seconds, timeout_ms=1000)
        after = proc.cpu_times()
        cpu = (after.user + after.system) - (before.user + before.system)
        return result, cpu * 1000 / max(result.count, 1)
    finally:
        process.stop()


def markdown(
    cells: dict[tuple[str, int], list[tuple[ghz.Result, float]]],
    rates: Sequence[int],
    strategies: Sequence[str],
    command: str,
    seconds: float,
    repeats: int,
    extra_us: float,
    loads: Sequence[float],
) -> str:
    """The report: medians of the alternating runs per strategy and rate."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    lines = [
        "# When the gateway emits its decision event: strategies side by side",
        "",
        f"`{command}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine_line()}.",
        "",
        "A Score server on the project's runtime answers a canned response and emits the real "
        "decision event onto a file log with each strategy; ghz drives it directly, open loop, "
        f"{seconds:g} s per run; strategies alternate and every cell is the median of {repeats} "
        f"runs. Extra busy work per emit: {extra_us:g} µs. Server CPU: user + system of the "
        "server process over the run, per call. 1-minute load average during the runs: "
        f"{min(loads):.1f}–{max(loads):.1f}.",
        "",
        "| strategy | rps | p50 ms | p99 ms | p99.9 ms | server CPU µs/call | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for rps in rates:
        for strategy in strategies:
            runs = cells[(strategy, rps)]
            lines.append(
                f"| {strategy} | {rps} | {med([r.p50_ms for r, _ in runs]):.3f} | "
                f"{med([r.p99_ms for r, _ in runs]):.3f} | {med([r.p999_ms for r, _ in runs]):.3f} "
                f"| {med([c for _, c in runs]) * 1000:.0f} | "
                f"{sum(r.error_count for r, _ in runs)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the strategies side by side; prints and writes a Markdown table of medians (and
    the runs as JSON) to ``--out``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        _serve(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="200,400")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extra-us", type=float, default=0.0)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None, help="Base name; default emit-strategies[-extra].")
    args = parser.parse_args(argv)
    command = " ".join(["python -m loadtest.emit_bench", *argv])
    rates = [int(r) for r in args.rates.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    cells: dict[tuple[str, int], list[tuple[ghz.Result, float]]] = {}
    loads: list[float] = []
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="emit-bench-") as tmp:
        work = Path(tmp)
        for repeat in range(args.repeats):
            for rps in rates:
                for strategy in strategies:
                    result, cpu_ms = measure(strategy, rps, args.seconds, args.extra_us, work)
                    loads.append(os.getloadavg()[0])
                    cells.setdefault((strategy, rps), []).append((result, cpu_ms))
                    runs.append(
                        {
                            "repeat": repeat + 1,
                            "strategy": strategy,
                            "rps": rps,
                            "result": result.to_dict(),
                            "server_cpu_ms_per_call": cpu_ms,
                            "load_average": loads[-1],
                        }
                    )
                    print(
                        f"run {repeat + 1} {strategy:>13} {rps} rps: p50 {result.p50_ms:.3f} "
                        f"p99 {result.p99_ms:.3f} ms, cpu {cpu_ms * 1000:.0f} µs/call, "
                        f"errors {result.error_count}",
                        flush=True,
                    )
    report = markdown(
        cells, rates, strategies, command, args.seconds, args.repeats, args.extra_us, loads
    )
    name = args.name or (
        "emit-strategies" + (f"-extra{args.extra_us:g}us" if args.extra_us else "")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    prov = provenance.record(command)
    (args.out / f"{name}.md").write_text(provenance.markdown(report, prov))
    (args.out / f"{name}.json").write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "command": command,
                "finished": datetime.now(UTC).isoformat(),
                "machine": machine_line(),
                "seconds": args.seconds,
                "repeats": args.repeats,
                "extra_us": args.extra_us,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"\n{report}\nwrote {args.out / (name + '.md')}")


if __name__ == "__main__":
    main()
