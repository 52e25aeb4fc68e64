"""In-image smoke test of the fraudmesh image, run by ``scripts/images.sh`` with ``buildah run``.

Runs as the image's user inside the built image, with a published model mounted read-only
under ``/var/lib/fraudmesh/models``. Checks what the Kubernetes manifests rely on: a
non-root user who cannot write the root filesystem, no compiler, every installed
distribution pinned by the lock, every entry point importable, no load-test suite (module,
distribution or ``fraudmesh`` command), the Envoy template shipped
as package data, the event log's clients (Kafka's native library, Redis) and a CA bundle
for TLS to managed brokers and stores, ``tar`` for ``kubectl cp`` of exports, the scorer
answering SERVING on its gRPC health check with the mounted model, and the decision sink
SERVING on an event log (the file backend, under /tmp), both exiting 0 on SIGTERM. Prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCK = Path("/opt/fraudmesh/requirements.lock")
STATE = Path("/var/lib/fraudmesh")
ENTRY_MODULES = (
    "services.gateway.__main__",
    "services.features.__main__",
    "services.scorer.__main__",
    "services.updater.__main__",
    "services.decisionlog.__main__",
    "services.monitor.__main__",
    "services.cli",
)
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "ld", "make")
SERVING_DEADLINE_S = 180.0


def ok(message: str) -> None:
    """Reports a passed check."""
    print(f"ok    {message}", flush=True)


def fail(message: str) -> None:
    """Reports a failed check and exits."""
    print(f"FAIL  {message}", flush=True)
    sys.exit(1)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_user() -> None:
    """The process is not root, and the root filesystem is not writable to it."""
    if os.getuid() == 0 or os.getgid() == 0:
        fail(f"running as uid {os.getuid()} gid {os.getgid()}: the image must not run as root")
    for folder in ("/", "/opt/fraudmesh", "/usr/lib", "/etc"):
        probe = Path(folder) / ".smoke-write-probe"
        try:
            probe.write_text("x")
        except OSError:
            continue
        probe.unlink()
        fail(f"{folder} is writable by uid {os.getuid()}")
    for writable in (STATE, Path("/var/cache/fraudmesh"), Path(os.environ["HOME"])):
        if not os.access(writable, os.W_OK):
            fail(f"{writable} must be writable by uid {os.getuid()}")
    ok(f"uid {os.getuid()}, root filesystem not writable; state, cache and HOME writable")


def check_no_compiler() -> None:
    """No compiler or build tool is on PATH, and pip is not installed."""
    found = [name for name in COMPILERS if shutil.which(name)]
    if found:
        fail(f"build tools in the runtime image: {found}")
    try:
        importlib.import_module("pip")
    except ImportError:
        ok("no compiler, linker, make or pip in the image")
        return
    fail("pip is installed in the runtime image")


def check_pinned() -> None:
    """Every installed distribution is in the lock, at the lock's version."""
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        requirement = line.split(";")[0]
        name, sep, version = requirement.partition("==")
        if sep and not line.startswith("#"):
            pins[_normalize(name)] = version.strip()
    unpinned = []
    for dist in importlib.metadata.distributions():
        name = _normalize(dist.metadata["Name"])
        if name == "fraudmesh":
            continue
        if pins.get(name) != dist.version:
            unpinned.append(f"{name}=={dist.version} (lock: {pins.get(name, 'absent')})")
    if unpinned:
        fail(f"distributions not pinned by the lock: {unpinned}")
    count = sum(1 for _ in importlib.metadata.distributions())
    ok(f"{count} distributions installed, each at its requirements.lock version")


def check_entry_points() -> None:
    """Each server module and the console script import, and the CLI answers --help."""
    for module in ENTRY_MODULES:
        importlib.import_module(module)
    result = subprocess.run(
        ["fraudmesh", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0 or "train" not in result.stdout:
        fail(f"fraudmesh --help exited {result.returncode}: {result.stderr[-2000:]}")
    ok(f"entry points import ({', '.join(ENTRY_MODULES)}); fraudmesh --help answers")


def check_no_load_test_suite() -> None:
    """The load-test suite, its commands and its distribution are not in the image."""
    if importlib.util.find_spec("loadtest") is not None:
        fail("the module loadtest is importable in the runtime image")
    prefix = Path(sys.prefix)
    found = [str(p) for p in prefix.rglob("loadtest") if "site-packages" in p.parts]
    if found:
        fail(f"load-test files in the runtime image: {found}")
    names = {_normalize(d.metadata["Name"]) for d in importlib.metadata.distributions()}
    if "fraudmesh-loadtest" in names:
        fail("the fraudmesh-loadtest distribution is installed in the runtime image")
    commands = importlib.metadata.entry_points(group="fraudmesh.commands")
    if commands:
        fail(f"fraudmesh.commands entry points in the runtime image: {list(commands)}")
    ok("no load-test suite: no loadtest module, distribution or fraudmesh.commands entry point")


def check_envoy_template() -> None:
    """The Envoy bootstrap template ships inside the installed package."""
    from services.common import envoy

    text = envoy.render_config(
        listen_port=8080, admin_port=9901, gateway_port=50051, gateway_dns="gateway"
    )
    if "envoy.cluster.dns" not in text:
        fail("the packaged Envoy template did not render a DNS gateway cluster")
    ok(f"Envoy template found as package data at {envoy.TEMPLATE}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def check_eventlog_clients() -> None:
    """The event log's backends load, and TLS has a CA bundle to verify brokers and stores."""
    import confluent_kafka
    import redis

    cas = ssl.create_default_context().cert_store_stats()["x509_ca"]
    if cas == 0:
        fail("no CA certificates: TLS to a managed Kafka or Redis cannot verify the server")
    if shutil.which("tar") is None:
        fail("no tar: `kubectl cp` of a decision export needs it in the container")
    ok(
        f"librdkafka {confluent_kafka.libversion()[0]}, redis-py {redis.__version__}, "
        f"{cas} CA certificates, tar"
    )


def _serve_until_serving(module: str, port: int, env: dict[str, str]) -> tuple[float, float]:
    """Starts ``python -m module``, waits for SERVING on ``port``, sends SIGTERM and waits
    for exit 0; returns the seconds to SERVING and the RSS in MB at that moment."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", module], env={**os.environ, **env})
    status = "no answer"
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() - started < SERVING_DEADLINE_S:
                if process.poll() is not None:
                    fail(f"{module} exited with {process.returncode} before SERVING")
                try:
                    answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                except grpc.RpcError as error:
                    status = error.code().name
                if status == "SERVING":
                    break
                time.sleep(0.2)
            else:
                fail(f"{module} did not report SERVING within {SERVING_DEADLINE_S:.0f} s")
        elapsed = time.monotonic() - started
        rss = _rss_mb(process.pid)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if code != 0:
        fail(f"{module} exited with {code} after SIGTERM")
    return elapsed, rss


def check_scorer_serving() -> None:
    """Starts the scorer on the mounted model and waits for SERVING, then stops it."""
    if not any((STATE / "models").glob("*/*/model.onnx")):
        fail(f"no model mounted under {STATE / 'models'}")
    port = _free_port()
    elapsed, rss = _serve_until_serving(
        "services.scorer",
        port,
        {
            "FRAUD_SCORER_HOST": "127.0.0.1",
            "FRAUD_SCORER_PORT": str(port),
            "FRAUD_SCORER_VAR_DIR": str(STATE),
        },
    )
    ok(
        f"scorer SERVING on its gRPC health check after {elapsed:.1f} s "
        f"(RSS {rss:.0f} MB); exited 0 on SIGTERM"
    )


def check_monitor_serving() -> None:
    """Starts the monitor on an empty file event log (references from the image's state)
    and waits for SERVING."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="smoke-monitor-") as folder:
        elapsed, rss = _serve_until_serving(
            "services.monitor",
            port,
            {
                "FRAUD_MONITOR_HOST": "127.0.0.1",
                "FRAUD_MONITOR_PORT": str(port),
                "FRAUD_MONITOR_VAR_DIR": str(STATE),
                "FRAUD_MONITOR_STATE_DIR": folder,
                "FRAUD_EVENTLOG_BACKEND": "file",
                "FRAUD_EVENTLOG_VAR_DIR": folder,
            },
        )
    ok(
        f"monitor SERVING on its gRPC health check after {elapsed:.1f} s "
        f"(RSS {rss:.0f} MB); exited 0 on SIGTERM"
    )


def check_sink_serving() -> None:
    """Starts the decision sink on an empty file event log and waits for SERVING."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="smoke-sink-") as folder:
        elapsed, rss = _serve_until_serving(
            "services.decisionlog",
            port,
            {
                "FRAUD_DECISIONLOG_HOST": "127.0.0.1",
                "FRAUD_DECISIONLOG_PORT": str(port),
                "FRAUD_DECISIONLOG_VAR_DIR": folder,
                "FRAUD_EVENTLOG_BACKEND": "file",
                "FRAUD_EVENTLOG_VAR_DIR": folder,
            },
        )
    ok(
        f"decision sink SERVING on its gRPC health check after {elapsed:.1f} s "
        f"(RSS {rss:.0f} MB); exited 0 on SIGTERM"
    )


def main() -> None:
    """Runs every check in order."""
    check_user()
    check_no_compiler()
    check_pinned()
    check_entry_points()
    check_no_load_test_suite()
    check_envoy_template()
    check_eventlog_clients()
    check_scorer_serving()
    check_sink_serving()
    check_monitor_serving()
    print("smoke test passed", flush=True)


if __name__ == "__main__":
    main()
