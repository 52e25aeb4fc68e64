"""What the Kubernetes deployment relies on, checked with real processes on this machine.

- The Envoy template ships inside the package: a normal (non-editable) install renders it.
- The rendering for cluster DNS passes ``envoy --mode validate``.
- Channels spread calls over every address of a name (round robin), as the gateway needs
  behind a headless Service.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from services.common import channels, envoy

REPO = Path(__file__).resolve().parents[2]


def test_a_normal_install_finds_the_envoy_template(tmp_path: Path) -> None:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("fraudmesh-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300
    )
    script = (
        "from services.common import envoy\n"
        "print(envoy.TEMPLATE)\n"
        "text = envoy.render_config(listen_port=8080, admin_port=9901, gateway_port=50051)\n"
        "assert 'port_value: 50051' in text\n"
    )
    # The installed copy comes first on the path, and the working directory is elsewhere:
    # nothing can be found through the checkout.
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == site / "services" / "common" / "envoy.yaml.tmpl"


def test_the_cluster_rendering_validates(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(
        envoy.render_config(
            listen_port=8080,
            admin_port=9901,
            gateway_port=50051,
            listen_address="0.0.0.0",
            gateway_dns="gateway.fraudmesh.svc.cluster.local",
        )
    )
    checked = subprocess.run(
        [str(envoy.envoy_binary()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    text = config.read_text()
    assert "envoy.cluster.dns" in text and "type: STATIC" not in text
    assert "address: 0.0.0.0, port_value: 8080" in text
    assert "address: gateway.fraudmesh.svc.cluster.local, port_value: 50051" in text


def test_the_cluster_rendering_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="DNS name"):
        envoy.render_config(
            listen_port=8080, admin_port=9901, gateway_port=50051, gateway_dns="Gate_way"
        )
    with pytest.raises(ValueError, match="no extra ports"):
        envoy.render_config(
            listen_port=8080,
            admin_port=9901,
            gateway_port=50051,
            gateway_dns="gateway",
            extra_gateway_ports=(50061,),
        )
    with pytest.raises(ValueError, match="IP address"):
        envoy.render_config(
            listen_port=8080, admin_port=9901, gateway_port=50051, listen_address="localhost"
        )
    # The gateway runs elsewhere: its port may equal Envoy's own.
    envoy.render_config(listen_port=8080, admin_port=9901, gateway_port=8080, gateway_dns="gw")


def test_envoy_command_is_the_binary_and_envoy_args(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    assert envoy.envoy_command(config) == [str(envoy.envoy_binary()), *envoy.envoy_args(config)]


async def test_channels_spread_calls_over_every_address() -> None:
    method = "/fraudmesh.test.Echo/Who"
    servers, ports = [], []
    for index in range(2):

        def who(request: bytes, context: grpc.aio.ServicerContext, index: int = index) -> bytes:
            return bytes([index])

        handler = grpc.method_handlers_generic_handler(
            "fraudmesh.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        ports.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        servers.append(server)
    try:
        # One target, two addresses: what a headless Service with two ready pods resolves to.
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
        async with channels.insecure_channel(target) as channel:
            call = channel.unary_unary(method)
            await asyncio.wait_for(channel.channel_ready(), 30)
            answers = [await call(b"", timeout=10) for _ in range(40)]
    finally:
        for server in servers:
            await server.stop(0)
    assert {answer[0] for answer in answers} == {0, 1}
