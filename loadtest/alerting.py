"""The degraded-answers alert, end to end: a mesh with Prometheus and its rules under steady
traffic, the feature service frozen (SIGSTOP), the alert firing in Prometheus, the service
thawed (SIGCONT), the alert resolving.

``python -m loadtest.alerting --var-dir var`` (part of ``make chaos``): loopback only, a
steady 20 Scores a second, bounded in time (a minute of warm-up, then at most three minutes
for the alert to fire and four to resolve); exit status 1 when it does not fire or resolve
in time. Prints how long each took and writes it to ``loadtest/results/alerting.{md,json}``
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest import data, provenance
from services.cli.up import METRICS_PROCESSES
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig, free_port

ALERT = "FraudmeshDegradedAnswers"
FIRE_LIMIT_S = 180.0
"""The alert must fire within three minutes of the freeze."""
RESOLVE_LIMIT_S = 240.0
WARMUP_S = 60.0
RATE = 20.0
"""Scores a second: steady, far below what the mesh carries."""


@dataclass(frozen=True)
class Outcome:
    """What one run saw."""

    fired_after_s: float | None
    resolved_after_s: float | None
    alerts_seen: tuple[str, ...]
    calls: int
    failed_calls: int

    @property
    def passed(self) -> bool:
        """Fired within FIRE_LIMIT_S and resolved within RESOLVE_LIMIT_S."""
        return self.fired_after_s is not None and self.resolved_after_s is not None


class Traffic:
    """Steady Scores through Envoy from a thread, until stopped."""

    def __init__(self, target: str, population: Sequence[data.Txn], rate: float = RATE) -> None:
        self._target = target
        self._population = population
        self._interval = 1.0 / rate
        self._stop = threading.Event()
        self.calls = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        with grpc.insecure_channel(self._target) as channel:
            stub = pb_grpc.FraudScoringStub(channel)
            next_at = time.monotonic()
            while not self._stop.is_set():
                t = self._population[self.calls % len(self._population)]
                ts = Timestamp()
                ts.FromNanoseconds(time.time_ns())
                request = pb.ScoreRequest(
                    transaction_id=f"alerting-{time.time_ns()}",
                    card_id=t.card_id,
                    merchant_id=t.merchant_id,
                    amount_minor=t.amount_minor,
                    currency=t.currency,
                    timestamp=ts,
                )
                self.calls += 1
                try:
                    stub.Score(request, timeout=0.5)
                except grpc.RpcError:
                    self.failed += 1
                next_at += self._interval
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def firing(prometheus: str) -> dict[str, str]:
    """Alert name → state (pending or firing) of every active alert."""
    with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=5) as reply:
        alerts: list[dict[str, Any]] = json.load(reply)["data"]["alerts"]
    states: dict[str, str] = {}
    for alert in alerts:
        name = alert["labels"]["alertname"]
        if states.get(name) != "firing":
            states[name] = alert["state"]
    return states


def query(prometheus: str, promql: str) -> str:
    """The first value of an instant query, or '' without one."""
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as reply:
        result = json.load(reply)["data"]["result"]
    return str(result[0]["value"][1]) if result else ""


def _wait(prometheus: str, want_firing: bool, limit_s: float, seen: set[str]) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        states = firing(prometheus)
        seen.update(name for name, state in states.items() if state == "firing")
        if (states.get(ALERT) == "firing") == want_firing:
            return time.monotonic() - started
        time.sleep(2)
    return None


def run(var_dir: Path, log_dir: Path, log: Any = print) -> Outcome:
    """Starts the mesh, freezes and thaws the feature service; returns what it saw."""
    population = data.sample_population(
        FeatureStoreSettings(var_dir=var_dir).data_path, 200, data.Mix(1.0, 0.0, 0.0)
    )
    config = MeshConfig.on_free_ports(
        var_dir=var_dir,
        log_dir=log_dir / "logs",
        observability_dir=log_dir / "observability",
        metrics_ports={name: free_port() for name in METRICS_PROCESSES},
        observability=True,
    )
    mesh = Mesh(config)
    if "prometheus" not in mesh.processes:
        raise RuntimeError("prometheus is not installed: run `make system`")
    prometheus = f"http://{config.host}:{config.prometheus_port}"
    seen: set[str] = set()
    mesh.start(timeout_s=120)
    try:
        with Traffic(config.envoy_target, population) as traffic:
            log(f"steady traffic at {RATE:g}/s for {WARMUP_S:.0f} s …")
            time.sleep(WARMUP_S)
            if firing(prometheus).get(ALERT) == "firing":
                raise RuntimeError(f"{ALERT} fires before any fault: the baseline is degraded")
            log(
                f"degraded share before: {query(prometheus, 'fraudmesh:answers_degraded:ratio_rate1m')}"
            )
            features = mesh.processes["features"]
            with mesh.held("features"):
                features.signal(signal.SIGSTOP)
                log("feature service frozen (SIGSTOP); waiting for the alert …")
                fired = _wait(prometheus, True, FIRE_LIMIT_S, seen)
                log(f"{ALERT} after the freeze: {_seconds(fired)}")
                features.signal(signal.SIGCONT)
            log("feature service thawed (SIGCONT); waiting for the alert to resolve …")
            resolved = (
                _wait(prometheus, False, RESOLVE_LIMIT_S, seen) if fired is not None else None
            )
            log(f"{ALERT} resolved after the thaw: {_seconds(resolved)}")
            return Outcome(fired, resolved, tuple(sorted(seen)), traffic.calls, traffic.failed)
    finally:
        mesh.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; exit status 0 when the alert fired and resolved in time."""
    parser = argparse.ArgumentParser(prog="python -m loadtest.alerting", description=__doc__)
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--log-dir", type=Path, help="default: <var-dir>/alerting")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("results") / "alerting",
        help="results base path (.md and .json are written); default loadtest/results/alerting",
    )
    options = parser.parse_args(argv)
    log_dir = options.log_dir or options.var_dir / "alerting" / time.strftime("%Y%m%d-%H%M%S")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    outcome = run(options.var_dir, log_dir)
    table = (
        f"| alert | fired after (limit {FIRE_LIMIT_S:.0f} s) | resolved after SIGCONT | "
        "alerts that fired | calls (failed) |\n|---|---|---|---|---|\n"
        f"| {ALERT} | {_seconds(outcome.fired_after_s)} | {_seconds(outcome.resolved_after_s)} | "
        f"{', '.join(outcome.alerts_seen) or 'none'} | {outcome.calls} ({outcome.failed_calls}) |"
    )
    print(table)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance.record()
    options.out.with_suffix(".md").write_text(
        provenance.markdown(
            f"The degraded-answers alert end to end (`python -m loadtest.alerting`), started "
            f"{started}: the feature service frozen under 20 Scores a second.\n\n{table}\n",
            prov,
        )
    )
    options.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "provenance": prov.as_json(),
                "started": started,
                "alert": ALERT,
                "fire_limit_s": FIRE_LIMIT_S,
                "fired_after_s": outcome.fired_after_s,
                "resolved_after_s": outcome.resolved_after_s,
                "alerts_seen": list(outcome.alerts_seen),
                "calls": outcome.calls,
                "failed_calls": outcome.failed_calls,
                "passed": outcome.passed,
            },
            indent=2,
        )
    )
    return 0 if outcome.passed else 1


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"


if __name__ == "__main__":
    sys.exit(main())
