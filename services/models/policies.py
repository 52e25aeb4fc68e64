"""The fraud team's policies, versioned in the state folder as models are.

Layout under ``<var_dir>/policy``: ``versions/<N>.yaml`` holds each published policy as it
was written (never changed after), and ``state.json`` says which version is live, the
versions to roll back to and every change made (who, when, what). A version is published
as a candidate, promoted to live, and rolled back to what was live before it (possibly no
policy at all). Writers hold a lock and replace ``state.json`` whole; a gateway stats that
one file on each poll and reads it only when it changed (docs/controls.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.common.filecommit import locked, replace_bytes
from services.domain import policy as policy_domain
from services.models.lifecycle import FileKey, default_actor

POLICY_DIR = "policy"
"""The policies' folder under the state folder."""
STATE_FILE = "state.json"
"""The live pointer and history, beside the versions."""


class PolicyChange(BaseModel):
    """One change of the live policy, kept in the history."""

    model_config = ConfigDict(extra="forbid")

    at: float
    action: str
    version: str | None
    actor: str


class PolicyState(BaseModel):
    """What ``state.json`` holds."""

    model_config = ConfigDict(extra="forbid")

    live: str | None = None
    previous: list[str | None] = Field(default_factory=list)
    """What was live before, most recent last (None: no policy); rollback pops it."""
    history: list[PolicyChange] = Field(default_factory=list)


class CorruptPolicyState(FailedPrecondition):
    """``state.json`` cannot be read as a policy state."""


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """A published version and where it stands."""

    version: str
    state: str
    """``live``, ``previous`` (a rollback target) or ``candidate``."""
    rules: int
    shadow: int


class PolicyStore:
    """Publishes, promotes and rolls back policy versions in one folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = root / "versions"
        self.state_path = root / STATE_FILE
        self._lock = root / ".lock"

    @classmethod
    def in_state_folder(cls, var_dir: Path) -> PolicyStore:
        """The store of a state folder."""
        return cls(var_dir / POLICY_DIR)

    def file_key(self) -> FileKey | None:
        """The state file's identity now: a cheap stat that changes with every write."""
        try:
            st = self.state_path.stat()
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def read_state(self) -> PolicyState:
        """The state (empty when nothing was ever promoted)."""
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            return PolicyState()
        try:
            return PolicyState.model_validate_json(data)
        except ValidationError as error:
            raise CorruptPolicyState(f"{self.state_path.name} is not a policy state") from error

    def text(self, version: str) -> str:
        """The text of a published version; NotFound for an unknown one."""
        if not version.isdigit() or len(version) > 9:
            raise InvalidArgument("version", f"{version[:20]!r} is not a policy version number")
        try:
            return (self.versions / f"{int(version)}.yaml").read_text()
        except FileNotFoundError:
            raise NotFound(f"no policy version {version}") from None

    def live(self) -> policy_domain.Policy | None:
        """The live policy compiled, or None when no policy is live."""
        version = self.read_state().live
        if version is None:
            return None
        return policy_domain.load(self.text(version), version)

    def published(self) -> list[str]:
        """Every published version, oldest first."""
        if not self.versions.is_dir():
            return []
        found = [p.stem for p in self.versions.glob("*.yaml") if p.stem.isdigit()]
        return sorted(found, key=int)

    def publish(self, text: str, actor: str | None = None) -> str:
        """Checks ``text`` (``PolicyError`` when bad, nothing written) and stores it as the
        next version, a candidate; returns the version. ``actor`` is recorded as who did it
        (default: this process's user)."""
        policy_domain.parse(text)
        self.versions.mkdir(parents=True, exist_ok=True)
        with locked(self._lock):
            state = self.read_state()
            existing = self.published()
            version = str(int(existing[-1]) + 1 if existing else 1)
            replace_bytes(self.versions / f"{version}.yaml", text.encode())
            self._record(state, "publish", version, actor)
        return version

    def promote(self, version: str, actor: str | None = None) -> PolicyState:
        """Makes ``version`` live; the version live before becomes the rollback target.
        ``actor`` is recorded as who did it (default: this process's user)."""
        policy_domain.parse(self.text(version))
        with locked(self._lock):
            state = self.read_state()
            if state.live == version:
                raise FailedPrecondition(f"policy version {version} is already live")
            state.previous.append(state.live)
            state.live = version
            return self._record(state, "promote", version, actor)

    def rollback(self, actor: str | None = None) -> PolicyState:
        """Makes live again what was live before the current version (possibly no policy);
        ``actor`` as for ``promote``."""
        with locked(self._lock):
            state = self.read_state()
            if not state.previous:
                raise FailedPrecondition("nothing to roll back to: no policy was live before")
            state.live = state.previous.pop()
            return self._record(state, "rollback", state.live, actor)

    def listing(self) -> list[PolicyVersion]:
        """Every published version with its state and rule counts, newest first."""
        state = self.read_state()
        rows = []
        for version in reversed(self.published()):
            try:
                spec = policy_domain.parse(self.text(version))
                live = sum(r.mode is policy_domain.Mode.LIVE for r in spec.rules)
                shadow = len(spec.rules) - live
            except policy_domain.PolicyError:
                live = shadow = -1
            where = (
                "live"
                if version == state.live
                else "previous"
                if version in state.previous
                else "candidate"
            )
            rows.append(PolicyVersion(version, where, live, shadow))
        return rows

    def _record(
        self, state: PolicyState, action: str, version: str | None, actor: str | None = None
    ) -> PolicyState:
        """Adds the change to the history and replaces the state file whole."""
        self.root.mkdir(parents=True, exist_ok=True)
        state.history.append(
            PolicyChange(
                at=time.time(), action=action, version=version, actor=actor or default_actor()
            )
        )
        data = json.dumps(state.model_dump(mode="json"), indent=1).encode()
        replace_bytes(self.state_path, data)
        return state
