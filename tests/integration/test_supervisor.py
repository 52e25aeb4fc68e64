"""``fraudmesh up`` supervises its children: under steady traffic through Envoy, SIGKILL of the
scorer (then of the feature service) costs no call, the fallback (the version's small model, or
the rules for a version without one; the defaults) answers while it is down, and the model
(online features) answers again once the supervisor has restarted it.
A child that keeps crashing makes ``up`` stop everything and exit non-zero with its log.

"Costs no call": no call fails with anything but DEADLINE_EXCEEDED (Envoy ends a call at
50 ms), and the calls that ended from the kill on hold no more late or failed ones (past the
42 ms budget, or DEADLINE_EXCEEDED) than the calls before the kill, within max(15 calls, 1 %)
(``loadtest.faultwindow``): the machine's own hiccups cancel out, a lost call does not."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import faultwindow
from loadtest.up_bench import METRICS_BLOCK
from services import client
from services.domain import metrics
from services.mesh import grpc_serving
from services.mesh.process import free_port_block, up_ports

from .conftest import Known, first_full_quality, register_logs

pytestmark = pytest.mark.integration

WAIT_S = 120.0
"""Upper bound of every wait (start-up, restart); generous for a loaded machine."""
BASELINE_S = 5.0
"""Traffic before the kill: the baseline the calls after it are judged against."""

MAX_RESTARTS = 3


@dataclass
class Up:
    """A running ``fraudmesh up`` and where to reach it."""

    process: subprocess.Popen[bytes]
    target: str
    log: Path

    def output(self) -> str:
        """What ``up`` printed so far."""
        return self.log.read_text(errors="replace")

    def child(self, module: str) -> psutil.Process:
        """The running child process of ``services.<module>``."""
        for proc in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if f"services.{module}" in " ".join(proc.cmdline()):
                    return proc
            except psutil.NoSuchProcess:
                continue
        raise LookupError(module)


@pytest.fixture(scope="module")
def up(
    prepared_env: Any,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Up]:
    """``fraudmesh up`` as a subprocess on free ports, handed out once it has answered at
    full quality."""
    tmp = register_logs(request, tmp_path_factory.mktemp("up"))
    # Every port free: another mesh on the machine must not make a child fail to bind.
    names = ("envoy", "admin", "gateway", "features", "scorer", "decisionlog", "updater", "monitor")
    ports = up_ports(names, replicated=("admin", "gateway"))
    argv = [
        sys.executable, "-m", "services.cli", "up",
        "--var-dir", str(prepared_env.var_dir),
        *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port))),
        "--metrics-port", str(free_port_block(METRICS_BLOCK)),
        "--max-restarts", str(MAX_RESTARTS), "--restart-window", "600",
        "--no-observability",
        # One feature service and one scorer, called over the network: what is under test is
        # the fallback while the only one is down and the supervisor brings it back
        # (replicas: test_crash.py).
        "--features-replicas", "1", "--scorer-replicas", "1", "--no-gateway-in-process",
    ]  # fmt: skip
    log_path = tmp / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    running = Up(process, f"127.0.0.1:{ports['envoy']}", log_path)
    try:
        deadline = time.monotonic() + WAIT_S
        while not grpc_serving(running.target):
            assert process.poll() is None, running.output()
            assert time.monotonic() < deadline, running.output()
            time.sleep(0.2)
        first_full_quality(running.target, known)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


@dataclass
class Traffic:
    """Score calls through Envoy at a steady rate, each answer (or error) recorded."""

    target: str
    request: Callable[[], pb.ScoreRequest]
    interval_s: float = 0.05
    answers: list[tuple[float, pb.ScoreResponse, float]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    ended: list[tuple[float, float, bool]] = field(default_factory=list)
    """Every call: (monotonic end, seconds it took, whether it ended OK)."""
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Calls until stopped; the deadline is generous, Envoy caps a call at 50 ms."""
        with grpc.insecure_channel(self.target) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            stub = pb_grpc.FraudScoringStub(channel)
            while not self._stop.wait(self.interval_s):
                began = time.monotonic()
                try:
                    answer = stub.Score(self.request(), timeout=1.0)
                    took = time.monotonic() - began
                    self.answers.append((began, answer, took))
                    self.ended.append((began + took, took, True))
                except grpc.RpcError as error:
                    took = time.monotonic() - began
                    self.errors.append((began, f"{error.code().name}: {error.details()}"))  # type: ignore[attr-defined]
                    self.ended.append((began + took, took, False))

    def stop(self) -> None:
        """Ends the calls."""
        self._stop.set()

    def since(self, moment: float) -> list[pb.ScoreResponse]:
        """Answers to calls started after ``moment``."""
        return [answer for began, answer, _ in self.answers if began >= moment]

    def verdict(self, fault: float) -> faultwindow.Verdict:
        """The calls that ended from ``fault`` on, judged against those that ended before."""

        def bad(call: tuple[float, float, bool]) -> bool:
            return faultwindow.late_or_failed(call[2], call[1] * 1000)

        calls = list(self.ended)
        return faultwindow.judge(
            faultwindow.tally((c for c in calls if c[0] < fault), bad),
            faultwindow.tally((c for c in calls if c[0] >= fault), bad),
        )


@pytest.fixture
def traffic(up: Up, known: Known) -> Iterator[Traffic]:
    """Steady traffic for the length of a test."""
    sample = client.Sample("steady", known.card_id, known.merchant_id, known.amount_minor)
    steady = Traffic(up.target, sample.request)
    # A full garbage collection of what this process holds would pause the traffic's thread
    # for a tenth of a second or more, and the call in flight would look late: freeze it.
    gc.collect()
    gc.freeze()
    thread = threading.Thread(target=steady.run, daemon=True)
    thread.start()
    yield steady
    steady.stop()
    thread.join(10)


def _kill_and_wait_back(
    up: Up, traffic: Traffic, module: str, back: Callable[[pb.ScoreResponse], bool]
) -> tuple[float, float, int]:
    """SIGKILLs the child, waits until answers show it back; returns (the moment of the
    kill, seconds until back, answers that did without it)."""
    victim = up.child(module)
    killed = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    deadline = killed + WAIT_S
    while time.monotonic() < deadline:
        assert up.process.poll() is None, up.output()
        after = [(began, back(answer)) for began, answer, _ in traffic.answers if began >= killed]
        # Calls already under way at the kill may still have been answered by the victim:
        # "back" is the first such answer after one that did without it.
        gone = next((i for i, (_, ok) in enumerate(after) if not ok), None)
        if gone is not None:
            again = next((began for began, ok in after[gone:] if ok), None)
            if again is not None:
                return killed, again - killed, sum(1 for _, ok in after if not ok)
        time.sleep(0.1)
    pytest.fail(f"{module} not back within {WAIT_S} s:\n{up.output()}")


def _report(traffic: Traffic, label: str, seconds: float, without: int, killed: float) -> None:
    p50, p99 = metrics.percentiles([s for _, _, s in traffic.answers], (50, 99))
    print(
        f"\n{label}: back {seconds:.1f} s after SIGKILL; {without} answers without it; "
        f"{len(traffic.answers)} calls, {len(traffic.errors)} errors, "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
        f"{traffic.verdict(killed)}"
    )


def _the_kill_cost_no_call(traffic: Traffic, killed: float) -> None:
    """No call failed but by its deadline, and the calls from the kill on hold no more late
    ones than the baseline before it allows."""
    assert all(text.startswith("DEADLINE_EXCEEDED") for _, text in traffic.errors), traffic.errors
    verdict = traffic.verdict(killed)
    late = [
        (round(end - killed, 2), round(took * 1000, 1), ok)
        for end, took, ok in traffic.ended
        if faultwindow.late_or_failed(ok, took * 1000)
    ]
    assert verdict.ok, f"{verdict}; late or failed (s from the kill, ms, OK): {late}"


def test_scorer_killed_costs_no_call_rules_answer_then_the_model_again(
    up: Up, traffic: Traffic
) -> None:
    time.sleep(BASELINE_S)
    old = up.child("scorer").pid
    killed, seconds, without = _kill_and_wait_back(
        up, traffic, "scorer", lambda a: a.scored_by == pb.SCORED_BY_MODEL
    )
    _report(traffic, "scorer", seconds, without, killed)
    assert up.child("scorer").pid != old
    _the_kill_cost_no_call(traffic, killed)
    assert without > 0  # the fallback answered meanwhile
    assert "scorer restarted" in up.output()


def test_feature_service_killed_costs_no_call_defaults_then_online_again(
    up: Up, traffic: Traffic
) -> None:
    time.sleep(BASELINE_S)
    killed, seconds, without = _kill_and_wait_back(
        up, traffic, "features", lambda a: a.feature_source == pb.FEATURE_SOURCE_ONLINE
    )
    _report(traffic, "features", seconds, without, killed)
    _the_kill_cost_no_call(traffic, killed)
    assert without > 0
    assert "features restarted" in up.output()


def test_a_crash_loop_stops_everything_with_the_log(up: Up) -> None:
    # The scorer crashed once above; keep killing each new one until up gives up.
    children = psutil.Process(up.process.pid).children(recursive=True)
    for _ in range(MAX_RESTARTS + 1):
        if up.process.poll() is not None:
            break
        try:
            victim = up.child("scorer")
        except LookupError:
            time.sleep(0.2)
            continue
        victim.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + WAIT_S
        while up.process.poll() is None and time.monotonic() < deadline:
            try:
                if up.child("scorer").pid != victim.pid:
                    break
            except LookupError:
                pass
            time.sleep(0.1)
    assert up.process.wait(WAIT_S) == 1, up.output()
    output = up.output()
    assert f"scorer crashed {MAX_RESTARTS} times" in output
    assert "stopped" in output
    # The scorer's last log lines come with the verdict.
    assert '"service": "scorer"' in output.split("crashed")[-1]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"orphans left: {alive}"
