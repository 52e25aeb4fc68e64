"""The lifecycle of published model versions: states, routing and an audit trail.

Every version of a model is in one state::

    candidate ──► shadow ──► canary ──► live ──► retired
        │            │          │                   ▲
        └────────────┴──────────┴── retire ─────────┘

States, routing and history live in ``<model_root>/<name>/routing.json``, changed under a lock
and replaced atomically; readers poll it without a lock. What each state serves, how changes
are made safe across processes and how older folders are read: ``docs/lifecycle.md``.
"""

from __future__ import annotations

import contextlib
import enum
import getpass
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common import filecommit
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.domain.validation import shown
from services.models import repository

ROUTING_FILE = "routing.json"
"""The lifecycle file inside ``<model_root>/<name>/``."""
LOCK_FILE = ".routing.lock"
"""Lock file beside it; never replaced, so every writer locks the same inode."""
CANARY_BUCKETS = 10_000
"""Cards are hashed into this many buckets; a canary at P percent takes P * 100 of them."""


class VersionState(enum.StrEnum):
    """Where a version is in its lifecycle."""

    CANDIDATE = "candidate"
    SHADOW = "shadow"
    CANARY = "canary"
    LIVE = "live"
    RETIRED = "retired"


class LifecycleError(FailedPrecondition):
    """The change is not allowed in the current state; the message says why and what to do."""


class UnknownVersionError(NotFound):
    """No such version is published."""


class CorruptLifecycleFile(FailedPrecondition):
    """The lifecycle file cannot be read or is not a lifecycle (truncated, not JSON, wrong
    shape); nothing can be changed until it is repaired. The message names the file."""


class GateCheck(BaseModel):
    """One promotion gate and its outcome."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="parity, average_precision or latency_p99.")
    passed: bool
    value: float | None = Field(description="The candidate's figure (None: not measurable).")
    limit: float | None = Field(description="The figure it had to meet (None: no limit).")
    detail: str = Field("", description="How the figures compare, in words.")


class GateReport(BaseModel):
    """The promotion gates of a candidate, as evaluated when it was published."""

    model_config = ConfigDict(frozen=True)

    passed: bool
    checks: list[GateCheck]
    against: str | None = Field(description="Live version compared with (None: there was none).")
    evaluated_at: datetime

    def failures(self) -> list[GateCheck]:
        """The checks that failed."""
        return [c for c in self.checks if not c.passed]


class Transition(BaseModel):
    """One change of a version's state: the audit trail."""

    model_config = ConfigDict(frozen=True)

    version: str
    from_state: VersionState | None = Field(description="None when the version was first recorded.")
    to_state: VersionState
    at: datetime
    by: str = Field(description="Who made the change: user@host, or the gateway that did.")
    reason: str = ""
    generation: int = Field(description="The file's generation this change produced.")


class VersionRecord(BaseModel):
    """A published version's state and promotion gates."""

    version: str
    state: VersionState
    since: datetime = Field(description="When it entered this state.")
    gates: GateReport | None = Field(None, description="None: published without gates.")
    reason: str = Field("", description="Why it is in this state (e.g. an automatic rollback).")


class Canary(BaseModel):
    """The version answering a share of the cards, and the share."""

    model_config = ConfigDict(frozen=True)

    version: str
    percent: float = Field(gt=0, le=100, description="Share of cards, resolution 0.01 %.")

    @property
    def buckets(self) -> int:
        """How many of the ``CANARY_BUCKETS`` card buckets go to the canary."""
        return round(self.percent * CANARY_BUCKETS / 100)


class Routing(BaseModel):
    """Which version answers which traffic."""

    model_config = ConfigDict(frozen=True)

    live: str | None = None
    canary: Canary | None = None
    shadow: str | None = None
    previous: str | None = Field(
        None, description="The version the last promotion replaced: the rollback target."
    )

    def routed(self) -> list[str]:
        """Versions that receive traffic (live, canary, shadow), each once."""
        out = [v for v in (self.live, self.canary.version if self.canary else None) if v]
        if self.shadow and self.shadow not in out:
            out.append(self.shadow)
        return out

    def kept_loaded(self) -> list[str]:
        """Versions a scorer keeps loaded: the routed ones and the rollback target."""
        out = self.routed()
        if self.previous and self.previous not in out:
            out.append(self.previous)
        return out


class LifecycleState(BaseModel):
    """The whole lifecycle file of one model."""

    schema_version: int = 1
    name: str
    generation: int = Field(0, description="Bumped by every change; 0 before the first.")
    updated_at: datetime | None = None
    routing: Routing = Field(default_factory=Routing)
    versions: dict[str, VersionRecord] = Field(default_factory=dict)
    history: list[Transition] = Field(default_factory=list)

    def record(self, version: str) -> VersionRecord:
        """The record of ``version``; raises UnknownVersionError."""
        try:
            return self.versions[version]
        except KeyError:
            known = ", ".join(sorted(self.versions, key=_version_key)) or "none"
            raise UnknownVersionError(
                f"version {shown(version)} of {self.name!r} is not published (published: {known})"
            ) from None

    def traffic(self, version: str) -> str:
        """The version's share of traffic, in words (for listings)."""
        r = self.routing
        if version == r.live:
            return f"{100 - r.canary.percent:g}%" if r.canary else "100%"
        if r.canary and version == r.canary.version:
            return f"{r.canary.percent:g}%"
        if version == r.shadow:
            return "mirror"
        if version == r.previous:
            return "standby"
        return "-"

    def last_transition(self, version: str) -> Transition | None:
        """The latest change of ``version``, if any was recorded."""
        return next((t for t in reversed(self.history) if t.version == version), None)


@dataclass(frozen=True)
class LifecycleChange:
    """What one lifecycle operation did, for the caller to print."""

    before: Routing
    after: Routing
    generation: int
    transitions: list[Transition] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """False when the operation found nothing to do."""
        return bool(self.transitions) or self.before != self.after


def default_actor() -> str:
    """``user@host`` of this process, recorded as who made a change."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _first_problem(error: ValidationError) -> str:
    """The first validation problem in a few words, e.g. ``routing.canary.percent: ...``."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return (f"{where}: " if where else "") + first["msg"].splitlines()[0] + more


def _version_key(version: str) -> tuple[int, str]:
    return (
        (int(version), version) if version.isascii() and version.isdigit() else (1 << 62, version)
    )


def _with(what: str, reason: str) -> str:
    """``what``, followed by why when a reason is given."""
    return f"{what}: {reason}" if reason else what


def _now() -> datetime:
    return datetime.now(UTC)


FileKey = tuple[int, int, int, int]
"""Identity of the routing file (device, inode, size, mtime in ns); None when absent."""


class ModelLifecycle:
    """The lifecycle file of one model: read without locks, changed under an exclusive lock."""

    def __init__(
        self,
        model_root: Path,
        name: str = repository.DEFAULT_MODEL_NAME,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.model_root = model_root
        self.name = name
        self.folder = model_root / name
        self.path = self.folder / ROUTING_FILE
        self._clock = clock

    # Reading ---------------------------------------------------------------------------

    def file_key(self) -> FileKey | None:
        """The routing file's identity now: a cheap stat that changes with every write."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def read(self) -> LifecycleState:
        """The current state, with published versions the file does not know added as
        candidates, or the migrated view when there is no file yet."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return self._migrated()
        except OSError as error:
            raise CorruptLifecycleFile(f"{self.path} cannot be read: {error.strerror}") from error
        try:
            state = LifecycleState.model_validate_json(data)
        except ValidationError as error:
            raise CorruptLifecycleFile(
                f"{self.path} is not a valid lifecycle file ({_first_problem(error)}): "
                "repair or restore it"
            ) from error
        published = repository.published_versions(self.model_root, self.name)
        for version in published:
            if version not in state.versions:
                state.versions[version] = VersionRecord(
                    version=version,
                    state=VersionState.CANDIDATE,
                    since=self._published_at(version),
                    reason="published without a lifecycle record",
                )
        return state

    def _published_at(self, version: str) -> datetime:
        try:
            mtime = (self.folder / version / repository.METADATA_FILE).stat().st_mtime
        except OSError:
            return self._clock()
        return datetime.fromtimestamp(mtime, UTC)

    def _migrated(self) -> LifecycleState:
        """Versions published before lifecycle records existed: the highest is live."""
        published = repository.published_versions(self.model_root, self.name)
        state = LifecycleState(name=self.name)
        for version in published:
            live = version == published[-1]
            state.versions[version] = VersionRecord(
                version=version,
                state=VersionState.LIVE if live else VersionState.RETIRED,
                since=self._published_at(version),
                reason="highest published version" if live else "superseded before records",
            )
        if published:
            state.routing = Routing(live=published[-1])
        return state

    # Writing ---------------------------------------------------------------------------

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return filecommit.locked(self.folder / LOCK_FILE)

    def _write(self, state: LifecycleState) -> None:
        """Replaces the file atomically: a reader sees the old file or the new, never a part."""
        filecommit.replace_bytes(self.path, state.model_dump_json(indent=2).encode())

    def _change(
        self,
        mutate: Callable[[_Editor], None],
        by: str | None,
        expected_generation: int | None = None,
    ) -> LifecycleChange | None:
        """Applies ``mutate`` under the lock; None when ``expected_generation`` is stale."""
        if not self.folder.is_dir():
            # Nothing is published here: every change refuses (an unknown version, nothing to
            # roll back to), and must not leave a folder behind when it does.
            state = self._migrated()
            mutate(_Editor(state, by or default_actor(), self._clock()))
            return LifecycleChange(state.routing, state.routing, state.generation)
        with self._locked():
            state = self.read()
            if expected_generation is not None and state.generation != expected_generation:
                return None
            editor = _Editor(state, by or default_actor(), self._clock())
            before = state.routing
            mutate(editor)
            if not editor.transitions and state.routing == before:
                return LifecycleChange(before, before, state.generation, notes=editor.notes)
            state.generation += 1
            state.updated_at = editor.at
            stamped = [
                t.model_copy(update={"generation": state.generation}) for t in editor.transitions
            ]
            state.history.extend(stamped)
            self._write(state)
            return LifecycleChange(before, state.routing, state.generation, stamped, editor.notes)

    # Operations ------------------------------------------------------------------------

    def publish_candidate(
        self,
        metadata: repository.ModelMetadata,
        files: Mapping[str, Path],
        gates: GateReport | None = None,
        by: str | None = None,
    ) -> tuple[repository.ModelMetadata, Path, LifecycleChange]:
        """Publishes ``files`` as the next version and records it as a candidate with its
        gate report; returns the published metadata, its folder and the change.

        The version folder (metadata with metrics, parity figure and creation time) is
        written first; the record follows under the lock. Should the process die between
        the two, the folder is still found and treated as a candidate without gates.
        """
        self.materialize(by)
        folder = repository.publish(self.model_root, metadata, files)
        published, _ = repository.load(self.model_root, metadata.name, folder.name)

        def mutate(e: _Editor) -> None:
            e.state.versions.pop(folder.name, None)
            e.add(folder.name, VersionState.CANDIDATE, gates, "published")

        change = self._change(mutate, by)
        assert change is not None
        return published, folder, change

    def materialize(self, by: str | None = None) -> None:
        """Writes the migrated view when there is no file yet, so that versions published
        from now on are candidates rather than the highest, hence live, version."""
        if self.path.exists():
            return
        with self._locked():
            if self.path.exists():
                return
            state = self._migrated()
            at = self._clock()
            who = by or default_actor()
            state.generation = 1
            state.updated_at = at
            state.history = [
                Transition(
                    version=r.version,
                    from_state=None,
                    to_state=r.state,
                    at=at,
                    by=who,
                    reason=f"migrated: {r.reason}",
                    generation=1,
                )
                for r in state.versions.values()
            ]
            self._write(state)

    def record_gates(
        self, version: str, gates: GateReport, by: str | None = None
    ) -> LifecycleChange:
        """Records (or replaces) the gate report of a published version."""

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            record.gates = gates
            e.note(f"v{version}: gates {'passed' if gates.passed else 'failed'}")
            e.transitions.append(
                e.transition(version, record.state, record.state, "gates recorded")
            )

        return self._require(self._change(mutate, by))

    def annotate(self, version: str, reason: str, by: str | None = None) -> LifecycleChange:
        """Records an event of ``version`` that changes no state (a rollout step's verdict,
        a shadow gate's figures) in the history."""

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            e.transitions.append(e.transition(version, record.state, record.state, reason))

        return self._require(self._change(mutate, by))

    def shadow(self, version: str, by: str | None = None, reason: str = "") -> LifecycleChange:
        """``version`` scores live traffic in shadow (replacing any other shadow)."""

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            e.refuse_if(
                record.state is VersionState.LIVE, f"v{version} is live; shadow a candidate"
            )
            e.refuse_if(
                record.state is VersionState.RETIRED,
                f"v{version} is retired; publish a new version to try it again",
            )
            if record.state is VersionState.SHADOW:
                e.note(f"v{version} is already in shadow")
                return
            routing = e.state.routing
            if routing.shadow and routing.shadow != version:
                e.move(routing.shadow, VersionState.CANDIDATE, f"shadow replaced by v{version}")
            canary = routing.canary
            if canary and canary.version == version:
                e.note(f"v{version} leaves its {canary.percent:g}% canary")
                canary = None
            e.state.routing = routing.model_copy(update={"shadow": version, "canary": canary})
            e.move(version, VersionState.SHADOW, _with("shadow", reason))

        return self._require(self._change(mutate, by))

    def canary(
        self, version: str, percent: float, by: str | None = None, reason: str = ""
    ) -> LifecycleChange:
        """``version`` answers ``percent`` % of the cards (or changes its share)."""
        rounded = round(percent, 2) if math.isfinite(percent) else percent
        if not 0 < rounded <= 100:  # False for NaN as well
            raise InvalidArgument(
                "percent", f"must be from 0.01 to 100 (resolution 0.01), got {percent:g}"
            )
        share = Canary(version=version, percent=rounded)

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            routing = e.state.routing
            e.refuse_if(record.state is VersionState.LIVE, f"v{version} is already live")
            e.refuse_if(
                record.state is VersionState.RETIRED,
                f"v{version} is retired; publish a new version to try it again",
            )
            e.refuse_if(routing.live is None, "no live version to compare a canary with")
            current = routing.canary
            e.refuse_if(
                current is not None and current.version != version,
                f"v{current.version if current else ''} is already in canary at "
                f"{current.percent if current else 0:g}%: promote or retire it first",
            )
            e.refuse_failed_gates(record, "canary")
            if current is not None and current.version == version:
                if current.percent == share.percent:
                    e.note(f"v{version} already answers {share.percent:g}% of cards")
                    return
                e.state.routing = routing.model_copy(update={"canary": share})
                e.move(
                    version,
                    VersionState.CANARY,
                    _with(f"canary {current.percent:g}% → {share.percent:g}%", reason),
                )
                return
            shadow = None if routing.shadow == version else routing.shadow
            e.state.routing = routing.model_copy(update={"canary": share, "shadow": shadow})
            e.move(version, VersionState.CANARY, _with(f"canary at {share.percent:g}%", reason))

        return self._require(self._change(mutate, by))

    def promote(self, version: str, by: str | None = None, reason: str = "") -> LifecycleChange:
        """``version`` answers all traffic at once; the replaced live version stays loaded
        as the rollback target."""

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            routing = e.state.routing
            e.refuse_if(record.state is VersionState.LIVE, f"v{version} is already live")
            e.refuse_if(
                record.state is VersionState.RETIRED and version == routing.previous,
                f"v{version} is the previous live version: use `fraudmesh model rollback`",
            )
            e.refuse_if(
                record.state is VersionState.RETIRED,
                f"v{version} is retired; publish a new version to try it again",
            )
            e.refuse_failed_gates(record, "promote")
            if record.gates is None:
                e.note(f"v{version} was published without gates: promoted on your word")
            old = routing.live
            if routing.previous and routing.previous != old:
                e.note(f"v{routing.previous} is no longer kept for rollback")
            canary = (
                routing.canary if routing.canary and routing.canary.version != version else None
            )
            if routing.canary and canary is None:
                e.note(f"v{version} leaves its {routing.canary.percent:g}% canary")
            shadow = routing.shadow if routing.shadow != version else None
            e.state.routing = Routing(live=version, canary=canary, shadow=shadow, previous=old)
            if old is not None:
                e.move(old, VersionState.RETIRED, f"replaced by v{version}; kept for rollback")
            e.move(version, VersionState.LIVE, _with("promoted", reason))

        return self._require(self._change(mutate, by))

    def rollback(self, by: str | None = None, reason: str = "") -> LifecycleChange:
        """The previous live version answers all traffic again; the current one retires."""

        def mutate(e: _Editor) -> None:
            routing = e.state.routing
            target = routing.previous
            e.refuse_if(target is None, "no previous live version to roll back to")
            assert target is not None
            e.refuse_if(
                target not in e.state.versions,
                f"v{target} is no longer published; promote another version",
            )
            old = routing.live
            e.state.routing = routing.model_copy(update={"live": target, "previous": None})
            if old is not None:
                e.move(old, VersionState.RETIRED, reason or f"rolled back to v{target}")
            e.move(target, VersionState.LIVE, reason or f"rollback from v{old}")

        return self._require(self._change(mutate, by))

    def retire(self, version: str, by: str | None = None, reason: str = "") -> LifecycleChange:
        """Takes ``version`` out of service (candidate, shadow, canary or rollback target)."""

        def mutate(e: _Editor) -> None:
            record = e.state.record(version)
            routing = e.state.routing
            e.refuse_if(
                record.state is VersionState.LIVE,
                f"v{version} is live: promote another version or roll back first",
            )
            if record.state is VersionState.RETIRED:
                if routing.previous == version:
                    e.state.routing = routing.model_copy(update={"previous": None})
                    e.note(f"v{version} is no longer kept for rollback")
                else:
                    e.note(f"v{version} is already retired")
                return
            updates: dict[str, object] = {}
            if routing.shadow == version:
                updates["shadow"] = None
            if routing.canary and routing.canary.version == version:
                updates["canary"] = None
            e.state.routing = routing.model_copy(update=updates)
            e.move(version, VersionState.RETIRED, _with("retired", reason))

        return self._require(self._change(mutate, by))

    def abort_canary(
        self, version: str, expected_generation: int, reason: str, by: str | None = None
    ) -> LifecycleChange | None:
        """Automatic rollback: the canary ``version`` retires with ``reason``, but only if
        the file is still at ``expected_generation`` (else None: another writer won, or the
        routing changed since the breach was seen)."""

        def mutate(e: _Editor) -> None:
            canary = e.state.routing.canary
            if canary is None or canary.version != version:
                return
            e.state.routing = e.state.routing.model_copy(update={"canary": None})
            e.move(version, VersionState.RETIRED, f"automatic rollback: {reason}")

        change = self._change(mutate, by, expected_generation)
        return change if change is not None and change.changed else None

    @staticmethod
    def _require(change: LifecycleChange | None) -> LifecycleChange:
        assert change is not None  # only conditional changes return None
        return change


class _Editor:
    """Collects the transitions and notes of one change to a state being edited."""

    def __init__(self, state: LifecycleState, by: str, at: datetime) -> None:
        self.state = state
        self.by = by
        self.at = at
        self.transitions: list[Transition] = []
        self.notes: list[str] = []

    def transition(
        self, version: str, old: VersionState | None, new: VersionState, reason: str
    ) -> Transition:
        return Transition(
            version=version,
            from_state=old,
            to_state=new,
            at=self.at,
            by=self.by,
            reason=reason,
            generation=0,  # stamped when written
        )

    def add(self, version: str, state: VersionState, gates: GateReport | None, reason: str) -> None:
        self.state.versions[version] = VersionRecord(
            version=version, state=state, since=self.at, gates=gates, reason=reason
        )
        self.transitions.append(self.transition(version, None, state, reason))

    def move(self, version: str, new: VersionState, reason: str) -> None:
        record = self.state.record(version)
        self.transitions.append(self.transition(version, record.state, new, reason))
        if record.state is not new:
            record.since = self.at
        record.state = new
        record.reason = reason

    def note(self, text: str) -> None:
        self.notes.append(text)

    @staticmethod
    def refuse_if(condition: bool, message: str) -> None:
        if condition:
            raise LifecycleError(message)

    @staticmethod
    def refuse_failed_gates(record: VersionRecord, action: str) -> None:
        gates = record.gates
        if gates is not None and not gates.passed:
            failed = "; ".join(f"{c.name}: {c.detail}" for c in gates.failures())
            raise LifecycleError(f"v{record.version} failed its gates, {action} refused ({failed})")
