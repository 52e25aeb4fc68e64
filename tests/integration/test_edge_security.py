"""TLS, mutual TLS and JWT at the edge: a mesh with ``tls`` and ``auth=jwt`` (as ``fraudmesh
up --tls --auth jwt`` runs it), development credentials from ``fraudmesh certs``, and the
clients that must use them: the Python client, ``fraudmesh score``, the Go client, grpcurl
and ghz (the last two through reflection, without proto files)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from services import client
from services.cli import certs
from services.common import edge_security, envoy
from services.common.edge_security import EdgeSettings
from services.mesh import Mesh, MeshConfig, free_port, grpc_serving, http_ok

from .conftest import (
    ANSWER_DEADLINE_S,
    FULL_QUALITY_WAIT_S,
    Known,
    first_of,
    full_quality,
    go_tool,
    register_logs,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SUBJECT_RPS = 50
"""Each subject's bucket: this many calls at once, refilled by a tenth of it every 100 ms."""
EDGE_RPS = 10_000
"""The edge's shared bucket, far above any burst here: the per-subject limit is tested alone."""


@pytest.fixture(scope="module")
def tls_var(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state folder holding development credentials in tls/."""
    var = tmp_path_factory.mktemp("edge-var")
    certs.write_dev_credentials(var / "tls")
    return var


@pytest.fixture(scope="module")
def secure_mesh(
    prepared_env: Any,
    tls_var: Path,
    known: Known,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    """A mesh whose edge serves TLS only, requires tokens and has a plaintext health port;
    handed out once it has answered at full quality."""
    edge = EdgeSettings(
        var_dir=tls_var, tls=True, auth="jwt", health_port=free_port(), subject_rps=SUBJECT_RPS
    )
    config = MeshConfig.on_free_ports(
        var_dir=prepared_env.var_dir,
        log_dir=register_logs(request, tmp_path_factory.mktemp("edge-logs")),
        edge=edge,
        rate_limit_rps=EDGE_RPS,
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=120)
    try:
        warm = creds(tls_var, token=token(tls_var, "warm-up"))
        full_quality(
            lambda: client.score(config.envoy_target, sample(known), 1.0, warm),
            timeout_s=FULL_QUALITY_WAIT_S,
        )
        yield mesh
    finally:
        mesh.stop()


ISSUED: list[str] = []
"""Every token the tests mint: none may show up in a log."""


def token(tls_var: Path, subject: str = "acme", **kwargs: Any) -> str:
    """A token signed with the development key (remembered for the log check)."""
    minted = certs.mint_token(tls_var / "tls" / "jwt-key.pem", subject, **kwargs)
    ISSUED.append(minted)
    return minted


def creds(tls_var: Path, **kwargs: Any) -> client.Credentials:
    """TLS to the edge with the development CA, plus whatever ``kwargs`` add."""
    return client.Credentials(tls=True, ca_path=tls_var / "tls" / "ca.pem", **kwargs)


def sample(known: Known) -> pb.ScoreRequest:
    """A valid transaction of a known card."""
    return client.Sample("edge", known.card_id, known.merchant_id, known.amount_minor).request()


def test_tls_and_a_valid_token_score(secure_mesh: Mesh, tls_var: Path, known: Known) -> None:
    valid = creds(tls_var, token=token(tls_var))
    full_quality(lambda: client.score(secure_mesh.config.envoy_target, sample(known), 1.0, valid))


@pytest.mark.parametrize(
    "variant", ["none", "tampered", "expired", "wrong audience", "foreign key", "garbage"]
)
def test_calls_without_a_valid_token_are_unauthenticated(
    secure_mesh: Mesh, tls_var: Path, known: Known, variant: str, tmp_path: Path
) -> None:
    bad: str | None
    if variant == "none":
        bad = None
    elif variant == "tampered":
        good = token(tls_var)
        bad = good[:-6] + ("AAAAAA" if not good.endswith("AAAAAA") else "BBBBBB")
    elif variant == "expired":
        bad = token(tls_var, now=dt.datetime(2020, 1, 1, tzinfo=dt.UTC), ttl_s=60)
    elif variant == "wrong audience":
        bad = token(tls_var, audience="someone-else")
    elif variant == "foreign key":
        other = certs.write_dev_credentials(tmp_path / "tls")
        bad = certs.mint_token(other["jwt_key"], "acme")
    else:
        bad = "not.a.jwt"
    with pytest.raises(grpc.RpcError) as caught:
        client.score(secure_mesh.config.envoy_target, sample(known), 1.0, creds(tls_var, token=bad))
    # A verified token for another audience is Envoy's 403: authenticated, not allowed here.
    expected = "PERMISSION_DENIED" if variant == "wrong audience" else "UNAUTHENTICATED"
    assert caught.value.code().name == expected  # type: ignore[attr-defined]


def test_plaintext_is_refused(secure_mesh: Mesh, tls_var: Path, known: Known) -> None:
    target = secure_mesh.config.envoy_target
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.FraudScoringStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Score(
                sample(known),
                timeout=2,
                metadata=[("authorization", f"Bearer {token(tls_var)}")],
            )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert not grpc_serving(target)


def test_health_works_for_probes(secure_mesh: Mesh, tls_var: Path) -> None:
    # Over TLS without a token: probes do not carry credentials.
    with creds(tls_var).channel(secure_mesh.config.envoy_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    # Plaintext on the health-only listener (Kubernetes gRPC probes do not speak TLS).
    health_target = f"127.0.0.1:{secure_mesh.edge.health_port}"
    assert grpc_serving(health_target)
    with grpc.insecure_channel(health_target) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.FraudScoringStub(channel).Score(pb.ScoreRequest(), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]


def test_each_subject_has_its_own_rate_limit(
    secure_mesh: Mesh, tls_var: Path, known: Known
) -> None:
    # A fresh subject starts with a full bucket. A burst of four bucketfuls sent at once gets
    # through at least a bucketful and at most a bucketful plus what refilled while it lasted
    # (the sender's speed only widens that window); everything else is refused at the edge.
    alice = [("authorization", f"Bearer {token(tls_var, f'alice-{time.time_ns()}')}")]
    bob = [("authorization", f"Bearer {token(tls_var, f'bob-{time.time_ns()}')}")]
    burst = 4 * SUBJECT_RPS
    refill_per_tick, tick_s = max(1, SUBJECT_RPS // 10), 0.1
    with creds(tls_var).channel(secure_mesh.config.envoy_target) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = pb_grpc.FraudScoringStub(channel)
        began = time.monotonic()
        futures = [
            stub.Score.future(sample(known), timeout=5, metadata=alice) for _ in range(burst)
        ]
        codes: Counter[str] = Counter()
        for future in futures:
            error = future.exception()
            codes["OK" if error is None else f"{error.code().name}: {error.details()}"] += 1  # type: ignore[union-attr]
        lasted_s = time.monotonic() - began
        limited = codes["RESOURCE_EXHAUSTED: local_rate_limited"]
        # Past the edge, a call is answered, shed by the gateway's in-flight limit
        # (RESOURCE_EXHAUSTED with its own message) or cut at Envoy's 50 ms.
        passed = burst - limited
        refilled = refill_per_tick * (math.floor(lasted_s / tick_s) + 1)
        print(f"burst of {burst} in {lasted_s:.3f} s: {passed} passed the edge, {dict(codes)}")
        assert SUBJECT_RPS <= passed <= SUBJECT_RPS + refilled, (codes, lasted_s)
        assert limited > 0, (codes, lasted_s)
        assert codes["OK"] > 0, codes
        kinds = {code.split(":")[0] for code in codes}
        assert kinds <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, codes
        # Bob's bucket is untouched by Alice's burst.
        answer = first_of(
            lambda: stub.Score(sample(known), timeout=5, metadata=bob), lambda a: True
        )
        assert answer.decision != 0


def test_fraudmesh_score_with_tls_and_a_token_file(
    secure_mesh: Mesh, tls_var: Path, known: Known, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(token(tls_var) + "\n")
    argv = [
        sys.executable, "-m", "services.cli", "score",
        "--target", secure_mesh.config.envoy_target,
        "--card-id", known.card_id, "--merchant-id", known.merchant_id,
        "--amount-minor", str(known.amount_minor), "--timeout-ms", "1000",
        "--ca", str(tls_var / "tls" / "ca.pem"), "--token-file", str(token_file),
    ]  # fmt: skip

    def run() -> subprocess.CompletedProcess[str]:
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        return ran

    assert "by=model" in first_of(run, lambda ran: "by=model" in ran.stdout).stdout
    env = {k: v for k, v in os.environ.items() if k != "FRAUDMESH_TOKEN"}
    no_token = subprocess.run(argv[:-2], capture_output=True, text=True, timeout=60, env=env)
    assert no_token.returncode == 1
    assert "UNAUTHENTICATED" in no_token.stdout


def test_go_client_with_tls_and_a_token(
    secure_mesh: Mesh, tls_var: Path, known: Known, tmp_path: Path, go_score_client: Path
) -> None:
    binary = go_score_client
    token_file = tmp_path / "token"
    token_file.write_text(token(tls_var))

    def run() -> dict[str, Any]:
        ran = subprocess.run(
            [
                str(binary),
                "-addr", secure_mesh.config.envoy_target, "-timeout", f"{ANSWER_DEADLINE_S:g}s",
                "-ca", str(tls_var / "tls" / "ca.pem"), "-token-file", str(token_file),
                "-card-id", known.card_id, "-merchant-id", known.merchant_id,
                "-amount-minor", str(known.amount_minor), "-json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        answer: dict[str, Any] = json.loads(ran.stdout)
        return answer

    assert first_of(run, lambda a: a["scoredBy"] == "SCORED_BY_MODEL")["scoredBy"] == (
        "SCORED_BY_MODEL"
    )


def test_grpcurl_and_ghz_through_tls_and_jwt_without_proto_files(
    secure_mesh: Mesh, tls_var: Path, known: Known
) -> None:
    target = secure_mesh.config.envoy_target
    ca = str(tls_var / "tls" / "ca.pem")
    bearer = f"Bearer {token(tls_var, 'tools')}"
    described = subprocess.run(
        [go_tool("grpcurl"), "-cacert", ca, "-H", f"authorization: {bearer}", target,
         "describe", "fraud.v1.FraudScoring.Score"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    assert "rpc Score" in described.stdout
    body = {
        "transaction_id": "ghz-{{.RequestNumber}}",
        "card_id": known.card_id,
        "merchant_id": known.merchant_id,
        "amount_minor": known.amount_minor,
        "currency": "EUR",
        "timestamp": "{{.Timestamp}}",
    }
    metadata = json.dumps({"authorization": bearer})
    ran = subprocess.run(
        [go_tool("ghz"), "--cacert", ca, "--metadata", metadata, "--reflect-metadata", metadata,
         "--call", "fraud.v1.FraudScoring.Score", "-d", json.dumps(body), "-n", "20", "-c", "2",
         "--format", "json", target],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    # Authenticated and resolved by reflection: answered, or (a starved machine) cut at 50 ms.
    statuses = report["statusCodeDistribution"]
    assert set(statuses) <= {"OK", "DeadlineExceeded"}, report.get("errorDistribution")
    assert statuses.get("OK", 0) > 0, report.get("errorDistribution")


def _wait(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"{what} not within {timeout_s} s")


def test_mutual_tls_requires_a_client_certificate(
    secure_mesh: Mesh, tls_var: Path, known: Known, tmp_path: Path
) -> None:
    # A second Envoy, mutual TLS without tokens, in front of the same gateway.
    listen, admin = free_port(), free_port()
    rendered = envoy.render_config(
        listen_port=listen,
        admin_port=admin,
        gateway_port=secure_mesh.config.gateway_port,
        access_log_path=str(tmp_path / "access.log"),
    )
    config = tmp_path / "envoy.yaml"
    config.write_text(edge_security.apply(rendered, EdgeSettings(var_dir=tls_var, mtls=True)))
    with (tmp_path / "envoy.log").open("wb") as log:
        process = subprocess.Popen(envoy.envoy_command(config), stdout=log, stderr=log)
    try:
        _wait(lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), "Envoy ready")

        def gateway_healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/clusters", timeout=1) as r:
                return "::health_flags::healthy" in r.read().decode()

        _wait(gateway_healthy, "the gateway healthy at the second Envoy")
        target = f"127.0.0.1:{listen}"
        tls = tls_var / "tls"
        mutual = creds(tls_var, cert_path=tls / "client.pem", key_path=tls / "client-key.pem")
        answer = first_of(lambda: client.score(target, sample(known), 1.0, mutual), lambda a: True)
        assert answer.decision != 0
        with creds(tls_var).channel(target) as channel, pytest.raises(grpc.RpcError) as caught:
            # Not waiting for a ready channel (the clients' default waits through a refused
            # handshake until the deadline): the refusal itself is what is checked.
            pb_grpc.FraudScoringStub(channel).Score(sample(known), timeout=2, wait_for_ready=False)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    finally:
        process.terminate()
        process.wait(10)


def test_no_token_or_private_key_reaches_a_log(secure_mesh: Mesh, tls_var: Path) -> None:
    # Runs last in this module: every token above was sent by now.
    assert ISSUED
    secrets = list(ISSUED)
    for key in ("server-key.pem", "client-key.pem", "jwt-key.pem"):
        lines = (tls_var / "tls" / key).read_text().splitlines()
        secrets += [line for line in lines if line and not line.startswith("-----")]
    logs = [p for p in secure_mesh.config.logs_path.rglob("*") if p.is_file()]
    assert any(p.name == "envoy-access.log" for p in logs)
    for path in logs:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a secret appears in {path.name}"
        assert "Bearer" not in text, path.name
