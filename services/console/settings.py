"""Settings of the console process (env prefix ``FRAUD_CONSOLE_``).

How the console is secured is the edge's own settings (``FRAUD_EDGE_*``,
``services.common.edge_security.EdgeSettings``): with ``FRAUD_EDGE_TLS`` it serves HTTPS with
the edge's certificate, with ``FRAUD_EDGE_AUTH=jwt`` every page needs a token the edge would
accept, and its verdicts go to the edge with that token.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.models import repository
from services.models.policies import POLICY_DIR


def is_loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ConsoleSettings(BaseSettings):
    """Where the console listens, what it reads and where it sends verdicts."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_CONSOLE_", extra="ignore", frozen=True)

    host: str = Field(
        "127.0.0.1",
        description="Address the console binds to. Loopback by default; another address "
        "needs FRAUD_EDGE_AUTH=jwt (or allow_unauthenticated_remote) so that nobody on the "
        "network reads decisions or gives verdicts unauthenticated.",
    )
    port: int = Field(8090, ge=0, le=65535, description="HTTP port; 0 lets the kernel choose.")
    allow_unauthenticated_remote: bool = Field(
        False,
        description="Serve a non-loopback address without tokens (a network where only "
        "analysts can reach it). Off: such a start is refused.",
    )
    var_dir: Path = Field(Path("var"), description="State root: decision log and models.")
    decisions_root: Path | None = Field(
        None, description="The decision log's folder; default <var_dir>/decisions."
    )
    model_root: Path | None = Field(
        None, description="Folder of published models; default <var_dir>/models."
    )
    model_name: str = Field(repository.DEFAULT_MODEL_NAME, description="Model shown.")
    outcome_target: str = Field(
        "127.0.0.1:8080",
        description="host:port verdicts are reported to (fraud.v1.OutcomeService at the edge).",
    )
    outcome_timeout_s: float = Field(
        5.0, gt=0, le=60, description="Deadline of one ReportOutcome call."
    )
    edge_ca_path: Path | None = Field(
        None,
        description="CA bundle that verifies the edge's certificate (FRAUD_EDGE_TLS); default "
        "<var_dir>/tls/ca.pem.",
    )
    edge_client_cert_path: Path | None = Field(
        None, description="Client certificate for a mutual-TLS edge; default <var_dir>/tls/."
    )
    edge_client_key_path: Path | None = Field(
        None, description="Its key (FRAUD_EDGE_MTLS); default <var_dir>/tls/."
    )
    prometheus_url: str | None = Field(
        "http://127.0.0.1:9090",
        description="Prometheus the overview queries (its HTTP API); unset: no overview figures.",
    )
    monitor_url: str | None = Field(
        None,
        description="The monitor's metrics page (http://host:port/metrics) the Models page "
        "reads drift and live quality from; unset: the monitor's gauges in Prometheus "
        "(prometheus_url).",
    )
    source_timeout_s: float = Field(
        2.0, gt=0, le=30, description="Deadline of one query to Prometheus or the monitor."
    )
    queue_days: int = Field(
        7,
        ge=1,
        le=90,
        description="The review queue holds REVIEW decisions of the last this many UTC days "
        "(the day partitions read).",
    )
    queue_max_rows: int = Field(
        100_000,
        ge=100,
        description="Most REVIEW decisions held in memory; beyond it the oldest are left out "
        "(and the page says so).",
    )
    lookup_days: int = Field(
        90,
        ge=1,
        description="A lookup by transaction id searches the decision log's last this many "
        "UTC days, newest first, and stops at the first day that holds it.",
    )
    page_size: int = Field(50, ge=1, le=500, description="Decisions per page of the queue.")
    csrf_secret: SecretStr | None = Field(
        None,
        description="Key of the CSRF tokens; unset: a random key per start (forms opened "
        "before a restart must be reloaded). Set the same value on every replica.",
    )
    allowed_hosts: str = Field(
        "127.0.0.1,localhost,::1",
        description="Comma-separated names (and addresses) the console answers to, as the "
        "browser's Host header carries them without the port. A request for any other host "
        "is refused with 421, so a page on another name that resolves to the console (DNS "
        "rebinding) cannot read it or act as it. Add the names analysts reach it by (its "
        "Ingress host, its Service name); '*' turns the check off.",
    )
    policy_dir: Path | None = Field(
        None,
        description="Folder of the fraud team's policy versions the Rules page shows and "
        "changes; default <var_dir>/policy (the gateway's FRAUD_GATEWAY_POLICY_DIR).",
    )
    controls_role: str = Field(
        "fraud-controls",
        min_length=1,
        max_length=128,
        description="With tokens: the role (in the token's 'roles' claim) that may change the "
        "lists and the live policy; every signed-in analyst may view them.",
    )
    entries_page_size: int = Field(
        100, ge=1, le=1000, description="List entries per page of the Lists page."
    )
    log_level: str = Field("INFO", description="Python logging level name.")

    @property
    def allowed_host_names(self) -> frozenset[str]:
        """``allowed_hosts`` as lower-case names, and the address the console binds to
        unless it is a wildcard (a browser may address it by that)."""
        names = {h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()}
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host.lower())
        return frozenset(names)

    @property
    def decisions_path(self) -> Path:
        """The decision log's folder."""
        return self.decisions_root or self.var_dir / "decisions"

    @property
    def policy_path(self) -> Path:
        """Folder of the policy versions."""
        return self.policy_dir or self.var_dir / POLICY_DIR

    @property
    def models_path(self) -> Path:
        """Folder of published models."""
        return self.model_root or self.var_dir / "models"
