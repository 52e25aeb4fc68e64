"""A wrapper around fortio's HTTP load generator, for the HTTP side of a side-by-side run.

fortio (``go install fortio.org/fortio@v1.66.5``) paces each of ``connections`` HTTP/1.1
keep-alive connections at ``rps / connections`` with uniform spacing and catches up after
a slow answer, so with many connections and answers much shorter than the per-connection
interval it sends at the offered rate regardless of the answers (close to open loop; a
connection does wait for its own answer, so queueing beyond the interval lowers the rate,
which shows as achieved < offered). Percentiles come from fortio's histogram at 0.1 ms
resolution (``-r 0.0001``), including p99.9; non-200 answers count as errors.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from loadtest.ghz import Result


def find_fortio() -> str:
    """Path of fortio (PATH, then ``$GOPATH/bin`` or ``~/go/bin``); raises if absent."""
    found = shutil.which("fortio")
    if found:
        return found
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    candidate = Path(gopath.split(os.pathsep)[0]) / "bin" / "fortio"
    if candidate.is_file():
        return str(candidate)
    raise FileNotFoundError(
        "fortio not found: install it with `go install fortio.org/fortio@v1.66.5`"
    )


def parse_report(report: dict[str, Any], offered_rps: float) -> Result:
    """A Result from fortio's ``-json`` report (latencies there are seconds)."""
    hist = report["DurationHistogram"]
    pct = {float(p["Percentile"]): float(p["Value"]) * 1000 for p in hist.get("Percentiles") or []}
    codes = {str(k): int(v) for k, v in (report.get("RetCodes") or {}).items()}
    count = int(hist["Count"])
    errors = count - codes.get("200", 0)
    statuses = {("OK" if code == "200" else f"HTTP {code}"): n for code, n in codes.items()}
    if errors and sum(statuses.values()) < count:
        statuses["connection error"] = count - sum(statuses.values())
    duration_s = float(report["ActualDuration"]) / 1e9
    return Result(
        offered_rps=offered_rps,
        achieved_rps=count / duration_s if duration_s else 0.0,
        count=count,
        duration_s=duration_s,
        p50_ms=pct.get(50.0, 0.0),
        p90_ms=pct.get(90.0, 0.0),
        p99_ms=pct.get(99.0, 0.0),
        p999_ms=pct.get(99.9, 0.0),
        max_ms=float(hist["Max"]) * 1000,
        mean_ms=float(hist["Avg"]) * 1000,
        status_counts=statuses,
        errors={},
    )


def run_fortio(
    url: str,
    body: bytes,
    *,
    rps: int,
    duration_s: float,
    connections: int | None = None,
    timeout_ms: float = 1000.0,
    fortio: str | None = None,
) -> Result:
    """POSTs ``body`` (JSON) to ``url`` at ``rps`` for ``duration_s`` and returns the figures."""
    conns = connections or max(8, math.ceil(rps / 20))
    with tempfile.TemporaryDirectory(prefix="fortio-") as tmp:
        payload = Path(tmp) / "body.json"
        payload.write_bytes(body)
        out = Path(tmp) / "out.json"
        argv = [
            fortio or find_fortio(),
            "load",
            "-quiet",
            "-qps",
            str(rps),
            "-t",
            f"{duration_s:g}s",
            "-c",
            str(conns),
            "-uniform",
            "-r",
            "0.0001",
            "-p",
            "50,90,99,99.9",
            "-timeout",
            f"{timeout_ms:g}ms",
            "-content-type",
            "application/json",
            "-payload-file",
            str(payload),
            "-json",
            str(out),
            url,
        ]
        completed = subprocess.run(argv, capture_output=True, timeout=duration_s + 60, check=False)
        if not out.is_file():
            raise RuntimeError(
                f"fortio exited with {completed.returncode}: "
                f"{completed.stderr.decode(errors='replace')[-2000:]}"
            )
        return parse_report(json.loads(out.read_text()), float(rps))
