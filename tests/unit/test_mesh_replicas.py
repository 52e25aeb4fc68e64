"""Replicas in the mesh's configuration: their names, ports, targets, start and stop order,
and the ports ``fraudmesh up`` gives them."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from services.cli.up import metrics_ports, replica_ports
from services.common.settings import from_mapping
from services.gateway.settings import GatewaySettings
from services.mesh import Mesh, MeshConfig
from services.mesh.config import replicas_target
from services.mesh.process import TERMINATE


def _config(tmp_path: Path, **replicas: tuple[int, ...]) -> MeshConfig:
    return MeshConfig(var_dir=tmp_path, log_dir=tmp_path / "logs", **replicas)  # type: ignore[arg-type]


def test_one_of_each_by_default(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert config.replica_ports("gateway") == {"gateway": 50051}
    assert config.replica_ports("envoy") == {"envoy": 9901}
    env = from_mapping(GatewaySettings, config.service_env())
    assert env.features_target == "127.0.0.1:50052"
    assert env.scorer_target == "127.0.0.1:50053"


def test_replicas_are_named_after_their_part_and_listed_for_the_gateway(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        extra_gateway_ports=(50151,),
        extra_admin_ports=(10001, 10101),
        extra_features_ports=(50152,),
        extra_scorer_ports=(50153,),
    )
    assert config.replica_ports("gateway") == {"gateway": 50051, "gateway-2": 50151}
    assert config.replica_ports("envoy") == {"envoy": 9901, "envoy-2": 10001, "envoy-3": 10101}
    settings = from_mapping(GatewaySettings, config.service_env())
    assert settings.features_target == "ipv4:127.0.0.1:50052,127.0.0.1:50152"
    assert settings.scorer_target == "ipv4:127.0.0.1:50053,127.0.0.1:50153"
    mesh = Mesh(config)
    names = list(mesh.processes)
    for name in ("gateway-2", "features-2", "scorer-2", "envoy-2", "envoy-3"):
        assert name in names
    # Dependencies start first; the Envoys start last and stop first.
    assert names.index("features-2") < names.index("gateway") < names.index("envoy")
    assert mesh._named("envoy") == ("envoy", "envoy-2", "envoy-3")
    assert mesh._named("gateway") == ("gateway", "gateway-2")


def test_a_replica_target_needs_an_ip_address() -> None:
    assert replicas_target("127.0.0.1", (1,)) == "127.0.0.1:1"
    assert replicas_target("127.0.0.1", (1, 2)) == "ipv4:127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(ValueError, match="IPv4"):
        replicas_target("localhost", (1, 2))


def test_up_places_replicas_a_step_apart_and_their_metrics_after_the_others() -> None:
    assert replica_ports(50051, 1, 100) == ()
    assert replica_ports(50051, 3, 100) == (50151, 50251)
    ports = metrics_ports(9101, ["gateway-2", "features-2"])
    assert ports["gateway"] == 9101
    assert ports["decisionlog"] == 9105
    assert ports["monitor"] == 9106
    assert ports["gateway-2"] == 9107
    assert ports["features-2"] == 9108


def test_free_ports_for_every_replica() -> None:
    config = MeshConfig.on_free_ports(gateway_replicas=2, envoy_replicas=2, scorer_replicas=3)
    ports = [
        *config.replica_ports("gateway").values(),
        *config.replica_ports("envoy").values(),
        *config.replica_ports("scorer").values(),
        *config.replica_ports("features").values(),
    ]
    assert len(ports) == 8
    assert len(set(ports)) == len(ports)


def test_a_whole_stop_drains_only_at_the_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Envoys stop first and drain (SIGTERM); the services behind them then get SIGINT,
    which skips their drain, since nothing routes calls to them any more."""
    config = _config(tmp_path, extra_gateway_ports=(50151,), extra_features_ports=(50152,))
    mesh = Mesh(config)
    sent: list[tuple[str, int]] = []
    lock = threading.Lock()
    for process in mesh.processes.values():

        def stop(timeout_s: float = 15.0, sig: int = TERMINATE, name: str = process.name) -> None:
            with lock:
                sent.append((name, sig))

        monkeypatch.setattr(process, "stop", stop)
    mesh.stop()
    order = [name for name, _ in sent]
    assert order.index("envoy") < min(order.index(n) for n in ("gateway", "gateway-2"))
    assert max(order.index(n) for n in ("gateway", "gateway-2")) < order.index("features")
    signals = dict(sent)
    assert signals["envoy"] == signal.SIGTERM
    for name in ("gateway", "gateway-2", "features", "features-2", "scorer"):
        assert signals[name] == signal.SIGINT, name
    others = set(signals) - {"envoy", "gateway", "gateway-2", "features", "features-2", "scorer"}
    assert others and all(signals[name] == signal.SIGTERM for name in others), signals
