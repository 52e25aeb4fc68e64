"""The fraud team's policy and lists end to end: Envoy, two gateway replicas and real services.

A malformed policy is refused by ``fraudmesh rules publish`` in one line naming the rule
and the field, and nothing changes. A rule "decline card-not-present payments over 5,000
EUR at merchant M" is published, promoted, and every replica then declines such a payment
with the rule named, while other payments still go to the model; a rule in shadow leaves
the answers alone and is recorded in the decision event; a rollback restores the model's
answers. A merchant's own thresholds change that merchant's answers only. A card on the
block list is declined on every replica until removed or expired; its expiry is audited and
swept off by the feature updater. Every change goes through
the ``fraudmesh rules`` and ``fraudmesh lists`` commands, as an operator makes it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pytest

from fraud.v1 import events_pb2, outcomes_pb2, outcomes_pb2_grpc
from fraud.v1 import scoring_pb2 as pb
from fraud.v1 import scoring_pb2_grpc as pb_grpc
from loadtest.brokers import RedisServer
from services.common.settings import from_mapping, to_env
from services.decisionlog.settings import DecisionLogSettings
from services.domain import money
from services.domain.lists import ListEntry, ListKind, ListName
from services.eventlog import EventLogSettings, open_consumer
from services.featurestore import layout
from services.featurestore.lists import open_lists
from services.featurestore.settings import FeatureStoreSettings
from services.mesh import Mesh, MeshConfig
from services.models.policies import PolicyStore
from services.pipelines import decisions as decisions_reader

from .conftest import (
    ANSWER_DEADLINE_S,
    Known,
    first_full_quality,
    first_of,
    register_logs,
    score_request,
)

pytestmark = pytest.mark.integration

EVENT_TOPIC = f"policy-{uuid.uuid4().hex[:8]}"
"""The event log topic of this module's mesh."""
FOLLOW_S = 10.0
"""Longest a promote or rollback may take to reach every replica: the gateways poll every
200 ms; the rest is slack for a loaded machine, never a figure judged."""
BIG_CNP_MINOR = 600_000
"""6,000 EUR: over the rule's 5,000 EUR."""


def _policy(merchant: str) -> str:
    return f"""
rules:
  - name: cnp-over-5000-at-m
    action: decline
    priority: 10
    reason: card not present over 5,000 EUR at merchant M
    scope: {{merchants: [{merchant}]}}
    when:
      channel: card_not_present
      amount_eur: {{gt: 5000}}
  - name: watch-all-cnp
    action: review
    mode: shadow
    when: {{channel: card_not_present}}
"""


PROBE_TERMINAL = "term-policy-probe"
"""A terminal only the probe rule names: its answers show a replica follows a version."""


def _shadow_only(merchant: str) -> str:
    return f"""
rules:
  - name: shadow-cnp-at-m
    action: decline
    mode: shadow
    when: {{channel: card_not_present, merchant: [{merchant}]}}
  - name: probe
    action: review
    when: {{terminal: [{PROBE_TERMINAL}]}}
"""


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("policy") / "policy"


@pytest.fixture(scope="module")
def policy_mesh(
    prepared_env: Any,
    known: Known,
    policy_dir: Path,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    config = MeshConfig.on_free_ports(
        gateway_replicas=2,
        var_dir=prepared_env.var_dir,
        log_dir=register_logs(request, tmp_path_factory.mktemp("policy-logs")),
        extra_env={
            "FRAUD_GATEWAY_POLICY_DIR": str(policy_dir),
            **to_env(EventLogSettings, topic=EVENT_TOPIC),
        },
    )
    mesh = Mesh(config)
    mesh.start(timeout_s=120)
    try:
        first_full_quality(config.envoy_target, known)
        yield mesh
    finally:
        mesh.stop()


def _rules(policy_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fraudmesh rules ARGS --policy-dir DIR`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "rules", *args, "--policy-dir", str(policy_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _targets(mesh: Mesh) -> dict[str, str]:
    """Envoy and each gateway replica directly."""
    host = mesh.config.host
    replicas = mesh.config.replica_ports("gateway")
    return {"envoy": mesh.config.envoy_target} | {
        name: f"{host}:{port}" for name, port in replicas.items()
    }


def _answer(target: str, req: pb.ScoreRequest) -> pb.ScoreResponse:
    with grpc.insecure_channel(target) as channel:
        return pb_grpc.FraudScoringStub(channel).Score(req, timeout=ANSWER_DEADLINE_S)


def _answer_uncut(target: str, req: pb.ScoreRequest) -> pb.ScoreResponse:
    """``req``'s answer; a call Envoy cut at its 50 ms cap on a saturated machine is sent again,
    up to three times, with another id (what the caller judges is the answer, not its time;
    any other status fails at once). The answer names the id it was given."""
    attempts = itertools.count()

    def send() -> pb.ScoreResponse:
        again = pb.ScoreRequest()
        again.CopyFrom(req)
        if n := next(attempts):
            again.transaction_id = f"{req.transaction_id}-{n}"
        return _answer(target, again)

    return first_of(send, lambda _: True, tries=3)


def _until_all(
    mesh: Mesh,
    req: Callable[[], pb.ScoreRequest],
    wanted: Callable[[pb.ScoreResponse], bool],
    timeout_s: float = FOLLOW_S,
) -> dict[str, pb.ScoreResponse]:
    """Each target's first wanted answer; fails naming the targets that gave none in time."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, pb.ScoreResponse] = {}
    last: dict[str, object] = {}
    while len(found) < len(_targets(mesh)):
        for name, target in _targets(mesh).items():
            if name in found:
                continue
            try:
                answer = _answer(target, req())
            except grpc.RpcError as error:
                last[name] = error.code()  # type: ignore[attr-defined]
                continue
            if wanted(answer):
                found[name] = answer
            last[name] = answer
        if time.monotonic() > deadline:
            missing = {n: last.get(n) for n in _targets(mesh) if n not in found}
            pytest.fail(f"no wanted answer in {timeout_s} s from {missing}")
        time.sleep(0.1)
    return found


def _by_rule(answer: pb.ScoreResponse) -> bool:
    return answer.reasons[:1] == [
        "rule cnp-over-5000-at-m: card not present over 5,000 EUR at merchant M"
    ]


def _by_model(answer: pb.ScoreResponse) -> bool:
    return answer.scored_by == pb.SCORED_BY_MODEL


def test_a_malformed_policy_is_refused_naming_rule_and_field(
    policy_mesh: Mesh, known: Known, policy_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_policy(known.merchant_id).replace("{gt: 5000}", "{gt: five thousand}"))
    result = _rules(policy_dir, "publish", str(bad))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "rule 'cnp-over-5000-at-m', field 'when.amount_eur.gt'" in lines[0]
    assert PolicyStore(policy_dir).published() == []
    cnp = score_request(known, channel=pb.CHANNEL_CARD_NOT_PRESENT, amount_minor=BIG_CNP_MINOR)
    assert not _answer(policy_mesh.config.envoy_target, cnp).model_version.startswith("policy-")


def test_a_live_rule_acts_on_every_replica_and_a_rollback_restores(
    policy_mesh: Mesh, known: Known, policy_dir: Path, tmp_path: Path
) -> None:
    def big_cnp() -> pb.ScoreRequest:
        return score_request(known, channel=pb.CHANNEL_CARD_NOT_PRESENT, amount_minor=BIG_CNP_MINOR)

    # Before: the model answers that payment on every replica.
    _until_all(policy_mesh, big_cnp, _by_model)
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(known.merchant_id))
    published = _rules(policy_dir, "publish", str(path))
    assert published.returncode == 0, published.stderr
    promoted = _rules(policy_dir, "promote", "1")
    assert promoted.returncode == 0, promoted.stderr
    decided = _until_all(policy_mesh, big_cnp, _by_rule)
    for answer in decided.values():
        assert answer.decision == pb.DECISION_DECLINE
        assert answer.scored_by == pb.SCORED_BY_RULES
        assert answer.model_version == "policy-1"
    # Outside the rule: a small card-not-present payment, and the big one in a shop.
    small = score_request(known, channel=pb.CHANNEL_CARD_NOT_PRESENT)
    present = score_request(known, amount_minor=BIG_CNP_MINOR)
    for target in _targets(policy_mesh).values():
        for req in (small, present):
            answer = _answer(target, req)
            assert not _by_rule(answer) and answer.model_version != "policy-1"
    rolled = _rules(policy_dir, "rollback")
    assert rolled.returncode == 0, rolled.stderr
    restored = _until_all(policy_mesh, big_cnp, _by_model)
    assert all(not _by_rule(a) and a.model_version != "policy-1" for a in restored.values())


def test_a_shadow_rule_changes_no_answer_and_is_in_the_decision_event(
    policy_mesh: Mesh, known: Known, policy_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "shadow.yaml"
    path.write_text(_shadow_only(known.merchant_id))
    published = _rules(policy_dir, "publish", str(path))
    assert published.returncode == 0, published.stderr
    version = published.stdout.split("policy v", 1)[1].split()[0]
    assert _rules(policy_dir, "promote", version).returncode == 0
    # Every replica follows the version once the probe rule answers there.
    _until_all(
        policy_mesh,
        lambda: score_request(known, terminal_id=PROBE_TERMINAL),
        lambda a: a.model_version == f"policy-{version}",
    )
    marker = f"shadow-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []

    def cnp() -> pb.ScoreRequest:
        req = score_request(known, channel=pb.CHANNEL_CARD_NOT_PRESENT)
        req.transaction_id = f"{marker}-{len(sent)}"
        sent.append(req.transaction_id)
        return req

    answers = _until_all(policy_mesh, cnp, _by_model)
    assert all(a.model_version != f"policy-{version}" for a in answers.values())
    answered = {a.transaction_id for a in answers.values()}
    events = _wait_for_events(policy_mesh, answered)
    for event in events:
        # What the shadow rule would have done is recorded; the answer is the model's.
        assert list(event.shadow_rules) == ["shadow-cnp-at-m=decline"]
        assert event.scored_by == pb.SCORED_BY_MODEL
    assert _rules(policy_dir, "rollback").returncode == 0


def _wait_for_events(mesh: Mesh, ids: set[str]) -> list[events_pb2.DecisionEvent]:
    """The decision events of ``ids``, read from the mesh's topic as they arrive."""
    settings = EventLogSettings(var_dir=mesh.config.var_dir, topic=EVENT_TOPIC, groups=())
    found: dict[str, events_pb2.DecisionEvent] = {}
    deadline = time.monotonic() + 30
    with open_consumer(settings, f"audit-{uuid.uuid4().hex[:8]}") as consumer:
        while set(found) != ids and time.monotonic() < deadline:
            for record in consumer.poll(5000, 0.5):
                envelope = record.envelope()
                event = envelope.decision
                if envelope.WhichOneof("event") == "decision" and event.transaction_id in ids:
                    found[event.transaction_id] = event
    assert set(found) == ids
    return list(found.values())


def _lists(var_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fraudmesh lists ARGS --var-dir DIR`` in a process of its own, auditing on the mesh's
    event log."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "lists", *args, "--var-dir", str(var_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **to_env(EventLogSettings, topic=EVENT_TOPIC)},
    )


def _list_changes(mesh: Mesh, value: str, count: int) -> list[events_pb2.ListChangeEvent]:
    """The audit records of the lists' changes of ``value`` on the mesh's event log, once
    ``count`` arrived (and any more that came with them)."""
    settings = EventLogSettings(var_dir=mesh.config.var_dir, topic=EVENT_TOPIC, groups=())
    found: list[events_pb2.ListChangeEvent] = []
    deadline = time.monotonic() + 30
    with open_consumer(settings, f"lists-{uuid.uuid4().hex[:8]}") as consumer:
        while time.monotonic() < deadline:
            records = consumer.poll(5000, 0.5)
            for record in records:
                envelope = record.envelope()
                kind = envelope.WhichOneof("event")
                if kind == "list_change" and envelope.list_change.value == value:
                    found.append(envelope.list_change)
            if len(found) >= count and not records:
                break
    return found


def test_a_blocked_card_is_declined_on_every_replica_until_removed_or_expired(
    policy_mesh: Mesh, known: Known
) -> None:
    var_dir = policy_mesh.config.var_dir
    reason = f"block list: card {known.card_id}: confirmed fraud"

    def pay() -> pb.ScoreRequest:
        return score_request(known)

    _until_all(policy_mesh, pay, _by_model)
    added = _lists(var_dir, "add", "card", known.card_id, "--reason", "confirmed fraud")
    assert added.returncode == 0, added.stderr
    again = _lists(var_dir, "add", "card", known.card_id, "--reason", "confirmed fraud")
    assert again.returncode == 0 and "unchanged" in again.stdout
    declined = _until_all(policy_mesh, pay, lambda a: a.reasons[:1] == [reason])
    assert all(a.decision == pb.DECISION_DECLINE for a in declined.values())
    assert all(a.model_version.startswith("lists-") for a in declined.values())
    removed = _lists(var_dir, "remove", "card", known.card_id)
    assert removed.returncode == 0, removed.stderr
    _until_all(policy_mesh, pay, _by_model)
    # An entry that expires: declined while it lasts, the model's answer once it has gone.
    expiring = _lists(
        var_dir, "add", "card", known.card_id, "--reason", "confirmed fraud", "--expires-in-s", "15"
    )
    assert expiring.returncode == 0, expiring.stderr
    _until_all(policy_mesh, pay, lambda a: a.reasons[:1] == [reason])
    _until_all(policy_mesh, pay, _by_model, timeout_s=30.0)
    # Every change is on the event log, once: the add that changed nothing is not, and the
    # expiry is, written by the feature updater when it swept the entry off the store.
    changes = _list_changes(policy_mesh, known.card_id, 4)
    assert [c.change for c in changes] == [
        events_pb2.LIST_CHANGE_ADD,
        events_pb2.LIST_CHANGE_REMOVE,
        events_pb2.LIST_CHANGE_ADD,
        events_pb2.LIST_CHANGE_EXPIRE,
    ]
    assert {(c.list, c.kind) for c in changes} == {("block", "card")}
    assert changes[0].reason == "confirmed fraud" and not changes[0].HasField("expires_at")
    assert changes[2].HasField("expires_at")
    expired = changes[3]
    assert expired.actor == "expiry" and expired.reason == "confirmed fraud"
    assert expired.expires_at == changes[2].expires_at == expired.changed_at
    store = open_lists(FeatureStoreSettings(var_dir=var_dir), reader=True)
    assert store is not None
    try:
        assert [e for e in store.entries()[1] if e.value == known.card_id] == []
    finally:
        store.close()


def test_the_lists_in_a_redis_online_store(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        settings = FeatureStoreSettings(
            var_dir=tmp_path, store="redis", redis_connection=f"{server.host}:{server.port}"
        )
        store = open_lists(settings)
        assert store is not None and store.entries() == (0, [])
        entry = ListEntry(ListKind.CARD_PREFIX, "411111", ListName.BLOCK, "bin", None, 1.0, "a")
        assert store.add(entry) and not store.add(entry)
        assert store.entries() == (1, [entry])
        assert store.remove(ListName.BLOCK, ListKind.CARD_PREFIX, "411111")
        assert not store.remove(ListName.BLOCK, ListKind.CARD_PREFIX, "411111")
        generation, entries = store.entries()
        assert (generation, store.generation(), entries) == (2, 2, [])
        store.close()
    finally:
        server.stop()


def test_a_merchants_thresholds_change_that_merchants_answers_only(
    policy_mesh: Mesh, known: Known, policy_dir: Path, tmp_path: Path, prepared_env: Any
) -> None:
    other = _other_merchant(prepared_env.data_dir, known)
    path = tmp_path / "thresholds.yaml"
    # Review and decline at 0: every model answer at the known merchant is a decline.
    path.write_text(f"thresholds: [{{merchants: [{known.merchant_id}], review: 0, decline: 0}}]\n")
    published = _rules(policy_dir, "publish", str(path))
    assert published.returncode == 0, published.stderr
    version = published.stdout.split("policy v", 1)[1].split()[0]
    assert _rules(policy_dir, "promote", version).returncode == 0
    own = f"the merchant's own thresholds (policy-{version})"
    mine = _until_all(policy_mesh, lambda: score_request(known), lambda a: own in a.reasons)
    for answer in mine.values():
        assert answer.decision == pb.DECISION_DECLINE
        assert answer.scored_by == pb.SCORED_BY_MODEL
    for target in _targets(policy_mesh).values():
        answer = _answer(target, score_request(known, merchant_id=other))
        assert own not in answer.reasons
    assert _rules(policy_dir, "rollback").returncode == 0
    _until_all(policy_mesh, lambda: score_request(known), lambda a: own not in a.reasons)


def _other_merchant(data_dir: Path, known: Known) -> str:
    """The busiest merchant of the simulated data other than the known one."""
    data = data_dir / layout.TRANSACTIONS_FILE
    merchants = pd.read_parquet(data, columns=["merchant_id"])["merchant_id"]
    return str(next(m for m in merchants.value_counts().index if m != known.merchant_id))


def _backtest_policy(merchant: str, other: str) -> str:
    """Live rules on the request and on a feature, a shadow rule, and one merchant's own
    thresholds: every way the policy decides."""
    return f"""
rules:
  - name: big-cnp
    action: decline
    priority: 10
    when: {{channel: card_not_present, amount_eur: {{gt: 1000}}}}
  - name: mid-amount-review
    action: review
    scope: {{merchants: [{other}]}}
    when: {{features: {{amount_eur: {{gte: 700, lt: 900}}}}}}
  - name: probe
    action: review
    when: {{terminal: [{PROBE_TERMINAL}]}}
  - name: shadow-cnp
    action: decline
    mode: shadow
    when: {{channel: card_not_present}}
thresholds:
  - merchants: [{merchant}]
    review: 0.0001
    decline: 0.5
"""


def _mixed_traffic(known: Known, other: str, marker: str) -> list[pb.ScoreRequest]:
    """Payments each rule decides, some no rule decides, at two merchants, present or not."""
    requests = []
    kinds = itertools.product(
        (1_000, 80_000, 120_000, 600_000), (False, True), (known.merchant_id, other)
    )
    for i, (amount, cnp, merchant) in enumerate(kinds):
        channel = pb.CHANNEL_CARD_NOT_PRESENT if cnp else pb.CHANNEL_CARD_PRESENT
        req = score_request(known, amount_minor=amount, merchant_id=merchant, channel=channel)
        req.transaction_id = f"{marker}-{i}"
        requests.append(req)
    return requests


def _report_outcomes(target: str, ids: list[str]) -> None:
    """Every other payment a fraud, the rest legitimate, as a chargeback feed would."""
    with grpc.insecure_channel(target) as channel:
        stub = outcomes_pb2_grpc.OutcomeServiceStub(channel)
        for i, tx in enumerate(ids):
            req = outcomes_pb2.ReportOutcomeRequest(
                transaction_id=tx,
                outcome=outcomes_pb2.OUTCOME_FRAUD if i % 2 else outcomes_pb2.OUTCOME_LEGITIMATE,
                source=outcomes_pb2.OUTCOME_SOURCE_CHARGEBACK,
            )
            req.reported_at.FromNanoseconds(time.time_ns())
            stub.ReportOutcome(req, timeout=5)


def _logged(root: Path, ids: set[str], timeout_s: float = 60) -> pd.DataFrame:
    """The decision log's rows of ``ids`` once every one of them and its outcome landed."""
    deadline = time.monotonic() + timeout_s
    while True:
        table, _ = decisions_reader.joined(root)
        frame = table.to_pandas()
        frame = frame[frame["transaction_id"].isin(ids)]
        if set(frame["transaction_id"]) == ids and frame["outcome"].notna().all():
            return frame.set_index("transaction_id")
        if time.monotonic() > deadline:
            pytest.fail(f"{len(frame)} of {len(ids)} decisions with outcomes in the log")
        time.sleep(1.0)


def _check_history(report: dict[str, Any], data_dir: Path) -> None:
    """The request-field rule's figures over the imported history equal a computation from
    the transactions file itself."""
    tx = pd.read_parquet(data_dir / layout.TRANSACTIONS_FILE)
    eur = [money.amount_eur(a, c) for a, c in zip(tx["amount_minor"], tx["currency"], strict=True)]
    tx["amount_eur"] = eur
    fired = tx[(tx["channel"] == "card_not_present") & (tx["amount_eur"] > 1000)]
    big = next(r for r in report["rules"] if r["name"] == "big-cnp")
    assert report["payments"] == len(tx) and report["frauds"]["count"] == int(tx["is_fraud"].sum())
    assert big["fires"]["count"] == len(fired) > 0
    assert big["frauds"]["count"] == int(fired["is_fraud"].sum())
    assert math.isclose(big["fires"]["amount_eur"], float(fired["amount_eur"].sum()))


def test_a_backtest_gives_the_live_paths_decisions(
    policy_mesh: Mesh, known: Known, policy_dir: Path, tmp_path: Path, prepared_env: Any
) -> None:
    other = _other_merchant(prepared_env.data_dir, known)
    path = tmp_path / "backtested.yaml"
    path.write_text(_backtest_policy(known.merchant_id, other))
    published = _rules(policy_dir, "publish", str(path))
    assert published.returncode == 0, published.stderr
    version = published.stdout.split("policy v", 1)[1].split()[0]
    assert _rules(policy_dir, "promote", version).returncode == 0
    _until_all(
        policy_mesh,
        lambda: score_request(known, terminal_id=PROBE_TERMINAL),
        lambda a: a.model_version == f"policy-{version}",
    )
    marker = f"backtest-{uuid.uuid4().hex[:8]}"
    targets = list(_targets(policy_mesh).values())
    answers = {}
    for i, req in enumerate(_mixed_traffic(known, other, marker)):
        answer = _answer_uncut(targets[i % len(targets)], req)
        answers[answer.transaction_id] = answer
    _report_outcomes(policy_mesh.config.envoy_target, sorted(answers))
    root = from_mapping(DecisionLogSettings, policy_mesh.config.decisionlog_env()).root_path
    logged = _logged(root, set(answers))
    out = tmp_path / "backtest.json"
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "rules", "backtest", version, "--source", "both",
         "--policy-dir", str(policy_dir), "--log-root", str(root), "--out", str(out),
         "--var-dir", str(prepared_env.var_dir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    _check_history(document["history"], prepared_env.data_dir)
    replayed = {d["transaction_id"]: d for d in document["log"]["decisions"]}
    names = {pb.DECISION_APPROVE: "approve", pb.DECISION_REVIEW: "review",
             pb.DECISION_DECLINE: "decline"}  # fmt: skip
    why = set()
    for tx, answer in answers.items():
        mine, row = replayed[tx], logged.loc[tx]
        assert mine["decision"] == names[answer.decision] == row["decision"], (tx, mine, answer)
        by_rule = answer.model_version == f"policy-{version}"
        rule = answer.reasons[0].split(":")[0].removeprefix("rule ") if by_rule else ""
        assert (mine["rule"] or "") == rule, (tx, mine, answer.reasons)
        assert mine["shadow_rules"] == list(row["shadow_rules"]), (tx, mine, row["shadow_rules"])
        why.add(mine["why"])
    # The traffic went every way the policy decides: a rule, or the model on the merchant's own
    # thresholds or on the version's.
    assert {"rule", "thresholds", "as logged"} <= why, why
    assert _rules(policy_dir, "rollback").returncode == 0
