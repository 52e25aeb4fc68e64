"""Profile the services under load: py-spy samples each Python service while ghz drives Score.

py-spy (``pip install py-spy``; ``make bench`` puts it in the bench virtual environment,
never in .venv) attaches to the running processes without pausing them (``--nonblocking``)
and samples only the thread holding the GIL (``--gil``), so the profile shows where each
service's Python time goes. For each service it writes the collapsed stacks
(``profile-<service>.txt``, flamegraph.pl / speedscope input) and ``profile.md``: the
functions with the largest inclusive and self share of the samples.

Run with ``python -m loadtest.profile [--rps 300] [--seconds 15] [--store redis]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from loadtest import data, ghz, provenance, runner

SERVICES = ("gateway", "features", "scorer")


def find_py_spy(extra: Sequence[Path] = ()) -> str:
    """py-spy on PATH or in one of ``extra`` bin folders; raises if absent."""
    found = shutil.which("py-spy")
    if found:
        return found
    for folder in extra:
        candidate = folder / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError("py-spy not found: `pip install py-spy` (outside .venv)")


def summarize(
    collapsed: Path, top: int = 15
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """Samples, top inclusive frames of project code, and top self frames of a collapsed file."""
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        leaf[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    own = [
        (f, c / total)
        for f, c in inclusive.most_common()
        if ("services/" in f or "loadtest/" in f) and "__main__" not in f and "server.py" not in f
    ][:top]
    selfs = [(f, c / total) for f, c in leaf.most_common(top)]
    return total, own, selfs


def _sample(
    spy: str,
    pid: int,
    output: Path,
    call: ghz.Call,
    target: str,
    file: Path,
    *,
    rps: int,
    seconds: float,
    rate_hz: int,
    timeout_ms: float,
) -> ghz.Result:
    """Loads ``target`` with ``call`` at ``rps`` while py-spy samples ``pid``."""
    result: list[ghz.Result] = []
    driver = threading.Thread(
        target=lambda: result.append(
            ghz.run_ghz(call, target, file, rps=rps, duration_s=seconds + 3, timeout_ms=timeout_ms)
        )
    )
    driver.start()
    time.sleep(1.5)
    subprocess.run(
        [spy, "record", "--pid", str(pid), "--duration", f"{seconds:g}", "--rate",
         str(rate_hz), "--nonblocking", "--gil", "--format", "raw", "--output", str(output)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 60, check=False,
    )  # fmt: skip
    driver.join()
    return result[0]


_LINE = re.compile(r":\d+\)$")


def profile(
    var_dir: Path,
    out_dir: Path,
    *,
    store: str = "redis",
    rps: int = 300,
    seconds: float = 15.0,
    rate_hz: int = 100,
    py_spy: str | None = None,
) -> Path:
    """Starts a mesh, loads it at ``rps`` and samples each service for ``seconds``."""
    spy = py_spy or find_py_spy([runner.ghz.REPO_ROOT / "build" / "mlserver-venv" / "bin"])
    work = out_dir / ".profile.tmp"
    mesh = runner.start_mesh(var_dir, store, work / "logs", log=lambda _: None)
    outputs = {name: out_dir / f"profile-{name}.txt" for name in SERVICES}
    results: dict[str, ghz.Result] = {}
    try:
        files = data.write_all(work, var_dir / "data", var_dir / "models", n=2000)
        c = mesh.config
        plan = {
            "gateway": (ghz.SCORE, c.envoy_target, files.score, 42.0),
            "features": (ghz.GET_FEATURES, f"{c.host}:{c.features_port}", files.features, 1000.0),
            "scorer": (ghz.MODEL_INFER, f"{c.host}:{c.scorer_port}", files.infer, 1000.0),
        }
        for name, (call, target, file, timeout_ms) in plan.items():
            results[name] = _sample(
                spy, mesh.processes[name].pid or 0, outputs[name], call, target, file,
                rps=rps, seconds=seconds, rate_hz=rate_hz, timeout_ms=timeout_ms,
            )  # fmt: skip
    finally:
        mesh.stop()
    lines = [
        f"# Profile under load: each service at {rps} rps ({store} store)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {runner.machine_line()}.",
        f"py-spy {rate_hz} Hz, {seconds:g} s per service, `--gil --nonblocking`: samples of "
        "the thread holding the GIL, i.e. where each service's Python time goes (time inside "
        "C code that released the GIL, and idle time, is not sampled). Each service is "
        "sampled under its own call at the same rate: the gateway under Score through Envoy, "
        "the feature service under GetFeatures, the scorer under ModelInfer (called "
        "directly, so the gateway's breakers cannot hide them). Frames are merged per "
        "function (line numbers dropped).",
    ]
    for name, path in outputs.items():
        if not path.is_file():
            lines += ["", f"## {name}", "", "no samples (py-spy failed to attach)"]
            continue
        total, own, selfs = summarize(path)
        lines += ["", f"## {name} ({total} samples)", ""]
        r = results.get(name)
        if r is not None:
            lines += [
                f"Load: achieved {r.achieved_rps:.0f} rps, p50 {r.p50_ms:.2f} ms, "
                f"p99 {r.p99_ms:.2f} ms, errors {r.error_share:.2%}.",
                "",
            ]
        lines += ["| inclusive | project function |"]
        lines += ["|---:|---|"] + [f"| {share:.1%} | `{frame}` |" for frame, share in own]
        lines += ["", "| self | frame |", "|---:|---|"]
        lines += [f"| {share:.1%} | `{frame}` |" for frame, share in selfs]
    md = out_dir / "profile.md"
    md.write_text(provenance.markdown("\n".join(lines) + "\n", provenance.record()))
    shutil.rmtree(work, ignore_errors=True)
    return md


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.profile``."""
    parser = argparse.ArgumentParser(description="py-spy profile of the services under load")
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=runner.RESULTS_DIR)
    parser.add_argument("--store", choices=["sqlite", "redis"], default="redis")
    parser.add_argument("--rps", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    runner.check_state(args.var_dir)
    md = profile(args.var_dir, args.out, store=args.store, rps=args.rps, seconds=args.seconds)
    print(md.read_text())


if __name__ == "__main__":
    main()
