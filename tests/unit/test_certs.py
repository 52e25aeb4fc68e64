"""Development credentials: a CA that signs the edge and client certificates, a JWT key and
its JWKS, and tokens the JWKS verifies."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import stat
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.cli import certs


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One set of development credentials."""
    return certs.write_dev_credentials(tmp_path_factory.mktemp("var") / "tls")


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_every_file_is_written_and_private_keys_are_owner_only(files: dict[str, Path]) -> None:
    assert {p.name for p in files.values()} == {
        "ca.pem",
        "server.pem",
        "server-key.pem",
        "client.pem",
        "client-key.pem",
        "jwt-key.pem",
        "jwks.json",
    }
    for role in ("key", "client_key", "jwt_key"):
        assert stat.S_IMODE(files[role].stat().st_mode) == 0o600, role


def test_the_ca_signs_server_and_client_certificates(files: dict[str, Path]) -> None:
    ca = _cert(files["ca"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role, usage in (
        ("cert", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client_cert", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        cert = _cert(files[role])
        cert.verify_directly_issued_by(ca)
        assert usage in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = (
        _cert(files["cert"]).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    )
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)


def test_tokens_verify_against_the_jwks(files: dict[str, Path]) -> None:
    token = certs.mint_token(files["jwt_key"], "acme-payments", ttl_s=60)
    (jwk,) = json.loads(files["jwks"].read_text())["keys"]
    assert jwt.get_unverified_header(token)["kid"] == jwk["kid"]
    key = jwt.PyJWK(jwk).key
    claims = jwt.decode(
        token, key, algorithms=["ES256"], audience="fraudmesh", issuer="fraudmesh-dev"
    )
    assert claims["sub"] == "acme-payments"
    assert claims["exp"] - claims["iat"] == 60


def test_expired_tokens_do_not_verify(files: dict[str, Path]) -> None:
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    token = certs.mint_token(files["jwt_key"], "x", ttl_s=60, now=past)
    (jwk,) = json.loads(files["jwks"].read_text())["keys"]
    with pytest.raises(jwt.ExpiredSignatureError):
        jwt.decode(token, jwt.PyJWK(jwk).key, algorithms=["ES256"], audience="fraudmesh")


def test_the_jwk_thumbprint_is_stable() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    assert certs.public_jwk(key) == certs.public_jwk(key)
    assert (
        certs.public_jwk(key)["kid"]
        != certs.public_jwk(ec.generate_private_key(ec.SECP256R1()))["kid"]
    )
