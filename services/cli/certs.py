"""Development credentials for the edge: a CA, server and client certificates, a JWT signing
key with its JWKS (``fraudmesh certs``), and signed tokens (``fraudmesh token``).

Everything here is for development and tests: production uses certificates from the
organisation's CA and a JWKS from its identity provider, named by ``FRAUD_EDGE_*`` settings
(docs/security.md). Private keys are written readable by their owner only.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import jwt
import typer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from rich.console import Console

from services.common.edge_security import DEV_FILES, EdgeSettings

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Names the development server certificate is valid for."""

ALGORITHM = "ES256"
"""JWT signature algorithm: ECDSA on P-256, small keys and tokens, fast to verify."""

console = Console(stderr=True)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """PEM, PKCS#8, unencrypted, mode 0600 from the first byte on."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fraudmesh development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    usage: x509.ObjectIdentifier,
    hosts: Sequence[str] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _ca(days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    name = _name("fraudmesh development CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    """The public half of ``key`` as a JWK, with its RFC 7638 thumbprint as ``kid``."""
    numbers = key.public_key().public_numbers()
    size = (key.curve.key_size + 7) // 8
    jwk = {
        "kty": "EC",
        "crv": "P-256",
        "x": _b64url(numbers.x.to_bytes(size, "big")),
        "y": _b64url(numbers.y.to_bytes(size, "big")),
    }
    thumbprint = hashlib.sha256(
        json.dumps(jwk, sort_keys=True, separators=(",", ":")).encode()
    ).digest()
    return {**jwk, "kid": _b64url(thumbprint), "alg": ALGORITHM, "use": "sig"}


def write_dev_credentials(
    tls_dir: Path,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    client_name: str = "fraudmesh-client",
    days: int = 365,
) -> dict[str, Path]:
    """Writes the development CA, server and client certificates, the JWT signing key and
    its JWKS into ``tls_dir`` (overwriting); returns the files by role (see DEV_FILES)."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls_dir, 0o700)
    files = {role: tls_dir / name for role, name in DEV_FILES.items()}
    ca_cert, ca_key = _ca(days)
    server_key, client_key, jwt_key = _key(), _key(), _key()
    server = _issue(
        "fraudmesh edge",
        server_key,
        ca_cert,
        ca_key,
        days,
        ExtendedKeyUsageOID.SERVER_AUTH,
        hosts,
    )
    client = _issue(client_name, client_key, ca_cert, ca_key, days, ExtendedKeyUsageOID.CLIENT_AUTH)
    _write_cert(files["ca"], ca_cert)
    _write_cert(files["cert"], server)
    _write_key(files["key"], server_key)
    _write_cert(files["client_cert"], client)
    _write_key(files["client_key"], client_key)
    _write_key(files["jwt_key"], jwt_key)
    files["jwks"].write_text(json.dumps({"keys": [public_jwk(jwt_key)]}, indent=2) + "\n")
    return files


def mint_token(
    key_path: Path,
    subject: str,
    *,
    ttl_s: int = 3600,
    issuer: str = "fraudmesh-dev",
    audience: str = "fraudmesh",
    now: dt.datetime | None = None,
    roles: Sequence[str] = (),
) -> str:
    """A JWT for ``subject`` signed with the key at ``key_path``, valid ``ttl_s`` seconds,
    with ``roles`` in its ``roles`` claim when given (the console's controls role)."""
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path} does not hold an EC private key")
    issued = now or dt.datetime.now(dt.UTC)
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "sub": subject,
        "iat": issued,
        "nbf": issued,
        "exp": issued + dt.timedelta(seconds=ttl_s),
        "jti": uuid.uuid4().hex,
    }
    if roles:
        claims["roles"] = list(roles)
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": public_jwk(key)["kid"]})


def certs_command(
    var_dir: Annotated[Path, typer.Option(help="State folder; files go to <var-dir>/tls/.")] = Path(
        "var"
    ),
    host: Annotated[
        list[str] | None,
        typer.Option(help="Name or address the server certificate is valid for (repeatable)."),
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of the certificates.")] = 365,
    force: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Create a development CA, edge server and client certificates, and a JWT key + JWKS."""
    tls_dir = var_dir / "tls"
    existing = [tls_dir / name for name in DEV_FILES.values() if (tls_dir / name).exists()]
    if existing and not force:
        console.print(
            f"[yellow]{tls_dir} already holds credentials[/yellow]; --force replaces them"
        )
        raise typer.Exit(0)
    files = write_dev_credentials(tls_dir, hosts=tuple(host or DEFAULT_HOSTS), days=days)
    for role, path in files.items():
        console.print(f"{role:12} {path}")
    console.print(
        "development only: private keys are unencrypted (mode 0600); see docs/security.md"
    )


def token_command(
    subject: Annotated[
        str, typer.Option(help="Client the token names (`sub`): its rate limit key.")
    ],
    ttl: Annotated[int, typer.Option(min=1, help="Seconds until the token expires.")] = 3600,
    var_dir: Annotated[Path, typer.Option(help="State folder holding tls/jwt-key.pem.")] = Path(
        "var"
    ),
    key: Annotated[
        Path | None, typer.Option(help="Signing key (PEM); default <var-dir>/tls/jwt-key.pem.")
    ] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(help="A role in the token's roles claim (repeatable), e.g. fraud-controls."),
    ] = None,
) -> None:
    """Print a signed bearer token for the edge (auth jwt) on standard output."""
    edge = EdgeSettings(var_dir=var_dir)
    key_path = key or var_dir / "tls" / DEV_FILES["jwt_key"]
    if not key_path.is_file():
        console.print(f"[red]no signing key at {key_path}[/red]: run fraudmesh certs first")
        raise typer.Exit(1)
    token = mint_token(
        key_path,
        subject,
        ttl_s=ttl,
        issuer=edge.jwt_issuer,
        audience=edge.jwt_audience,
        roles=tuple(role or ()),
    )
    # Standard output only, for the caller to capture; never logged.
    print(token)
