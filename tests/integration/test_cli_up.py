"""``fraudmesh up``: starts every process (as many of each on the request path as the machine's
cores call for, saying so), serves through Envoy, stops all on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from loadtest.up_bench import METRICS_BLOCK
from services import client
from services.mesh import grpc_serving, http_ok, sizing
from services.mesh.process import free_port_block, up_ports

from .conftest import Known

pytestmark = pytest.mark.integration


def test_up_serves_and_stops_without_orphans(
    prepared_env: Any, known: Known, tmp_path: Path
) -> None:
    names = (
        "envoy",
        "admin",
        "gateway",
        "features",
        "scorer",
        "decisionlog",
        "updater",
        "monitor",
        "console",
        # Prometheus and the trace collector (observability is on by default): they are
        # children too, and must not outlive `up` either.
        "prometheus",
        "otlp",
    )
    ports = up_ports(names, replicated=("admin", "gateway", "features", "scorer"))
    argv = [
        sys.executable, "-m", "services.cli", "up",
        "--var-dir", str(prepared_env.var_dir),
        *(arg for name, port in ports.items() for arg in (f"--{name}-port", str(port))),
        "--metrics-port", str(free_port_block(METRICS_BLOCK)),
    ]  # fmt: skip
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - closed in finally
    up = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        target = f"127.0.0.1:{ports['envoy']}"
        deadline = time.monotonic() + 120
        console = f"http://127.0.0.1:{ports['console']}/healthz"
        # The console starts last, once Envoy serves.
        while not (grpc_serving(target) and http_ok(console)):
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.2)
        children = psutil.Process(up.pid).children(recursive=True)
        commands = [" ".join(child.cmdline()) for child in children]
        sized = sizing.for_cores(sizing.usable_cores())
        for module in ("gateway", "features", "scorer"):
            count = sum(f"services.{module}" in c for c in commands)
            assert count == getattr(sized, module), commands
        # The gateways read the store and run the model themselves where the sizing says so.
        gateways = [c for c in children if "services.gateway" in " ".join(c.cmdline())]
        in_process = {c.environ().get("FRAUD_GATEWAY_IN_PROCESS") for c in gateways}
        assert in_process == {"true" if sized.gateway_in_process else None}, in_process
        envoys = [c for c in commands if "envoy" in c and "--config-path" in c]
        assert len(envoys) == sized.envoy, commands
        text = (tmp_path / "up.log").read_text()
        assert ("envoy-2" in text) == (sized.envoy == 2)
        # The table says what it chose and why, and the edge admits what the sizing says.
        assert " ".join(sized.reason.split()[:4]) in " ".join(text.split()), text
        bootstrap = yaml.safe_load(
            Path(envoys[0].split("--config-path ")[1].split()[0]).read_text()
        )
        (gateway,) = [
            c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "gateway"
        ]
        limit = gateway["circuit_breakers"]["thresholds"][0]["max_requests"]
        assert limit == -(-sized.edge_max_in_flight // sized.envoy)
        programs = {child.name() for child in children}
        assert {"prometheus", "otelcol-fraudmesh"} <= programs, programs
        assert http_ok(f"http://127.0.0.1:{ports['prometheus']}/-/ready")
        sample = client.Sample("cli", known.card_id, known.merchant_id, known.amount_minor)
        response = client.score(target, sample.request(), timeout_s=1.0)
        assert response.decision != 0
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0, (tmp_path / "up.log").read_text()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"orphans left: {alive}"
        assert "stopped" in (tmp_path / "up.log").read_text()
    finally:
        if up.poll() is None:
            up.kill()
        log.close()
