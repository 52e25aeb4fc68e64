"""``fraudmesh up``: starts every process (two of each on the request path by default), serves
through Envoy, stops all on SIGTERM."""

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

from services import client
from services.mesh import free_port, grpc_serving, http_ok

from .conftest import Known, up_ports

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
        "--metrics-port", str(free_port()),
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
        for module in ("gateway", "features", "scorer"):
            assert sum(f"services.{module}" in c for c in commands) == 2, commands
        assert sum("envoy" in c and "--config-path" in c for c in commands) == 2, commands
        assert "envoy-2" in (tmp_path / "up.log").read_text()
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
