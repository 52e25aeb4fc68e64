"""Every container of the project's image starts as its pod declares it, in each overlay.

``tests/integration/pods.py`` runs each Deployment, StatefulSet, Job and CronJob container of
the rendered overlay under bubblewrap: the pod's command and env, the image's working
directory, a read-only root, writable storage only at the declared mounts. Services must
pass their declared probe, Jobs exit 0 on the prepared data; a write outside the mounts
fails with the path named. The gateway's journal is then held to what docs/kubernetes.md
says of it: a killed container's successor, on the same emptyDir, delivers every answered
decision, and SIGTERM drains it within the pod's grace period.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from fraud.v1 import scoring_pb2_grpc
from loadtest.brokers import KafkaBroker, RedisServer, kafka_available
from services.eventlog.events import decode
from services.eventlog.journal_file import HEADER_SIZE
from services.eventlog.redis_streams import VALUE_FIELD
from services.mesh import free_port
from services.models import repository
from services.pipelines.autopilot import STATE_FILE

from .conftest import score_request
from .pods import (
    REPO,
    Cluster,
    Image,
    Pod,
    PodFailure,
    Running,
    render,
    run_to_end,
    start,
    wait_ready,
)

pytestmark = pytest.mark.integration

OVERLAYS = REPO / "deploy" / "k8s" / "overlays"
READY_S = 480.0
"""Generous: on a loaded 2-core machine five pods importing Feast at once take minutes, and
the gateway waits up to twice FRAUD_GATEWAY_DEPENDENCY_WAIT_S for the feature service."""
JOB_S = 600.0


@dataclasses.dataclass
class Up:
    """An overlay's pods running on this machine."""

    cluster: Cluster
    pods: list[Pod]
    image: Image
    running: dict[str, Running]
    """``Kind/workload/container`` → its running process (services only)."""
    logs: Path
    finished: list[str] = dataclasses.field(default_factory=list)
    """Job and CronJob containers that exited 0."""
    stream: redis.Redis | None = None

    def one(self, workload: str) -> Running:
        """The main container of ``workload``."""
        return next(r for r in self.running.values() if r.container.workload == workload)

    def restart(self, running: Running) -> Running:
        """Starts the same container again, into the same volumes, as a restart does."""
        c = running.container
        log = self.logs / f"{c.pod}-{c.name}-restarted.log"
        again = start(c, self.image, self.cluster.network_env(c), log)
        self.running[c.label] = again
        return again


def _run_pod(up: Up, pod: Pod) -> None:
    """Init containers to their end, then the main ones to their end (Jobs) or to ready."""
    env_of = up.cluster.network_env
    for c in pod.init:
        run_to_end(c, up.image, env_of(c), up.logs / f"{pod.name}-{c.name}.log", JOB_S)
    for c in pod.main:
        log = up.logs / f"{pod.name}-{c.name}.log"
        if pod.kind in ("Job", "CronJob"):
            run_to_end(c, up.image, env_of(c), log, JOB_S)
            up.finished.append(c.label)
            continue
        running = start(c, up.image, env_of(c), log)
        up.running[c.label] = running
        if c.probe is not None:
            wait_ready(running, READY_S)
            continue
        # The admin pod's container only waits for an operator's `kubectl exec`.
        time.sleep(1.0)
        if running.process.poll() is not None:
            raise running.fail(f"ended with {running.process.returncode}")


def run_pods(up: Up, pods: list[Pod]) -> None:
    """Runs ``pods`` at once, as a cluster would schedule them; raises every failure."""
    if not pods:
        return
    with ThreadPoolExecutor(max_workers=len(pods)) as pool:
        futures = [pool.submit(_run_pod, up, pod) for pod in pods]
        errors = [f.exception() for f in futures]
    failures = [e for e in errors if e is not None]
    if failures:
        raise PodFailure("\n\n".join(str(e) for e in failures))


def bring_up(up: Up, pods: list[Pod], known: Any) -> None:
    """The Jobs and every service at once; then, once decisions flowed through the gateway
    into the sink's log, the CronJobs (the retraining reads that log)."""
    run_pods(up, [p for p in pods if p.kind != "CronJob"])
    answered = score(known, up.one("gateway"), 20)
    sink = next(
        m.source for m in up.one("decision-sink").container.mounts if m.path == "/var/lib/fraudmesh"
    )
    deadline = time.monotonic() + READY_S
    while not list((sink / "decisions").rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert answered, "the gateway answered nothing"
    assert list((sink / "decisions").rglob("*.parquet")), "the sink wrote no decision log"
    run_pods(up, [p for p in pods if p.kind == "CronJob"])


def score(known: Any, gateway: Running, n: int) -> list[str]:
    """Scores ``n`` transactions through the gateway; the transaction ids answered."""
    stop = threading.Event()
    answered: list[str] = []
    for tx in _answers(known, gateway, stop):
        answered.append(tx)
        if len(answered) >= n:
            stop.set()
    return answered


def tear_down(up: Up) -> None:
    """SIGTERM to every container still running, SIGKILL past its grace."""
    for running in up.running.values():
        running.stop(30)


def cluster_for(
    overlay: str, root: Path, prepared_state: Any, outside: dict[str, str]
) -> tuple[Cluster, list[Pod]]:
    """The overlay's pods on this machine, with the shared state volume holding the
    prepared data (what the train Job leaves there)."""
    cluster = Cluster(render(OVERLAYS / overlay), root, outside)
    state = root / "claims" / "fraudmesh-state"
    prepared_state.copy_to(state)
    # A cluster whose retrain CronJob ran an hour ago: its run now decides, and is not due
    # (a first run would retrain, minutes of CPU on a loaded 2-core machine).
    last_run = datetime.now(UTC) - timedelta(hours=1)
    (state / "models" / repository.DEFAULT_MODEL_NAME / STATE_FILE).write_text(
        json.dumps({"last_run_at": last_run.isoformat(), "decision": "not due", "version": None})
    )
    cluster.claims["fraudmesh-state"] = state
    pods = cluster.pods()
    cluster.assign_ports(pods)
    return cluster, pods


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The Redis that stands for the online store and the dev overlay's Redis Streams."""
    server = RedisServer(tmp_path_factory.mktemp("pods-redis"))
    server.start()
    yield server
    server.stop()


def overlay_up(
    overlay: str, root: Path, prepared_state: Any, known: Any, outside: dict[str, str]
) -> Up:
    """The overlay's pods started on this machine (stopped by ``tear_down``)."""
    cluster, pods = cluster_for(overlay, root, prepared_state, outside)
    logs = root / "logs"
    logs.mkdir()
    up = Up(cluster, pods, Image.from_containerfile(), {}, logs)
    try:
        bring_up(up, pods, known)
    except BaseException:
        tear_down(up)
        raise
    return up


@pytest.fixture(scope="module")
def dev(
    prepared_state: Any,
    known: Any,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Up]:
    """The dev overlay's pods, every one started as its pod declares it."""
    host_port = f"127.0.0.1:{redis_server.port}"
    outside = {
        "FRAUD_FEATURES_REDIS_CONNECTION": host_port,
        "FRAUD_EVENTLOG_REDIS_URL": f"redis://{host_port}/0",
    }
    root = tmp_path_factory.mktemp("pods-dev")
    up = overlay_up("dev", root, prepared_state, known, outside)
    up.stream = redis.Redis.from_url(f"redis://{host_port}/0")
    yield up
    tear_down(up)


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The Kafka broker that stands for the production overlay's brokers outside the cluster."""
    if not kafka_available():
        pytest.fail("Java or the Kafka broker jars are missing: run `make test-brokers`")
    broker = KafkaBroker(tmp_path_factory.mktemp("pods-kafka"), quick_jit=True)
    broker.start()
    yield broker
    broker.stop()


def create_topic(broker: KafkaBroker, env: dict[str, str]) -> None:
    """Creates the topic as docs/kubernetes.md asks operators to, with the overlay's
    partitions (one replica: the test has one broker)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    partitions = int(env["FRAUD_EVENTLOG_KAFKA_PARTITIONS"])
    topic = NewTopic(env["FRAUD_EVENTLOG_TOPIC"], partitions, 1)
    # The client must outlive its futures: a collected one cancels them.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([topic]).values():
        future.result(60)


def test_every_production_container_starts_and_answers_within_its_mounts(
    prepared_state: Any,
    known: Any,
    redis_server: RedisServer,
    kafka_broker: KafkaBroker,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("pods-production")
    eventlog = next(
        d
        for d in render(OVERLAYS / "production")
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("fraudmesh-eventlog")
    )["data"]
    create_topic(kafka_broker, eventlog)
    outside = {
        "FRAUD_FEATURES_REDIS_CONNECTION": f"127.0.0.1:{redis_server.port}",
        "FRAUD_EVENTLOG_KAFKA_BOOTSTRAP": kafka_broker.bootstrap,
    }
    up = overlay_up("production", root, prepared_state, known, outside)
    try:
        check_every_container(up)
    finally:
        tear_down(up)


def check_every_container(up: Up) -> None:
    """Every container of the project's image ran: services answer and stay up with no
    refused write, Jobs and CronJobs exited 0."""
    declared = {c.label for pod in up.pods for c in pod.main}
    assert declared == set(up.running) | set(up.finished)
    for running in up.running.values():
        assert running.process.poll() is None, running.fail("ended")
        assert running.read_only_write() is None, running.fail("a write was refused")


def test_every_dev_container_starts_and_answers_within_its_mounts(dev: Up) -> None:
    check_every_container(dev)
    assert {"gateway", "features", "scorer", "updater", "decision-sink", "monitor"} <= {
        r.container.workload for r in dev.running.values()
    }
    assert {"train", "features-materialize", "retrain", "decisions-compact"} <= {
        label.split("/")[1] for label in dev.finished
    }


def test_removing_a_declared_mount_fails_with_the_path_named(dev: Up) -> None:
    gateway = dev.one("gateway").container
    spool = next(m for m in gateway.mounts if m.path == "/var/spool/fraudmesh")
    unmounted = dataclasses.replace(
        gateway,
        mounts=[m for m in gateway.mounts if m is not spool],
        ports={port: free_port() for port in gateway.ports},
    )
    env = dev.cluster.network_env(unmounted)
    running = start(unmounted, dev.image, env, dev.logs / "gateway-without-spool.log")
    try:
        with pytest.raises(PodFailure) as failure:
            wait_ready(running, READY_S)
    finally:
        running.stop(10)
    # The journal's folder (or the mount point it is made under: the image has neither).
    assert "wrote outside its mounts: /var/spool/fraudmesh" in str(failure.value)


def _answers(known: Any, gateway: Running, stop: threading.Event) -> Iterator[str]:
    """Scores until ``stop`` is set or the gateway stops answering; yields each answered id."""
    port = gateway.container.ports[50051]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scoring_pb2_grpc.FraudScoringStub(channel)
        n = 0
        while not stop.is_set():
            tx = f"pod-{time.time_ns()}-{n}"
            n += 1
            try:
                stub.Score(score_request(known, transaction_id=tx), timeout=5)
            except grpc.RpcError:
                return
            yield tx


def _answered_while(known: Any, gateway: Running, stop: threading.Event) -> list[str]:
    """Scores until ``stop`` is set or the gateway dies; the transaction ids answered."""
    return list(_answers(known, gateway, stop))


def delivered(up: Up) -> set[str]:
    """Transaction ids of the decisions on the dev overlay's Redis stream."""
    assert up.stream is not None
    topic = up.one("gateway").container.env["FRAUD_EVENTLOG_TOPIC"]
    ids = set()
    for _, fields in up.stream.xrange(topic):
        envelope = decode(fields[VALUE_FIELD])
        if envelope.WhichOneof("event") == "decision":
            ids.add(envelope.decision.transaction_id)
    return ids


def test_a_killed_gateway_container_loses_no_answered_decision(dev: Up, known: Any) -> None:
    gateway = dev.one("gateway")
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        calls = pool.submit(_answered_while, known, gateway, stop)
        deadline = time.monotonic() + 60
        while len(list(_journals(gateway))) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)
        gateway.signal(signal.SIGKILL)
        answered = calls.result(60)
        stop.set()
    gateway.process.wait(30)
    assert answered, gateway.fail("answered nothing before the kill")
    # The container restarts into the same emptyDir; the new process adopts the journal.
    again = dev.restart(gateway)
    wait_ready(again, READY_S)
    deadline = time.monotonic() + 120
    while not set(answered) <= delivered(dev) and time.monotonic() < deadline:
        time.sleep(0.5)
    missing = set(answered) - delivered(dev)
    assert not missing, f"{len(missing)} of {len(answered)} answered decisions never delivered"


def _journals(gateway: Running) -> Iterator[Path]:
    spool = next(m for m in gateway.container.mounts if m.path == "/var/spool/fraudmesh")
    return (spool.source / "eventlog-journal").rglob("journal-*.log")


def test_sigterm_delivers_every_answered_decision_within_the_grace_period(
    dev: Up, known: Any
) -> None:
    gateway = dev.one("gateway")
    workload = next(
        d
        for d in dev.cluster.docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway"
    )
    grace_s = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    answered = score(known, gateway, 50)
    assert answered, gateway.fail("answered nothing")
    # What a deleted pod gets: SIGTERM, then SIGKILL once the grace period is over.
    started = time.monotonic()
    gateway.signal(signal.SIGTERM)
    try:
        code = gateway.process.wait(grace_s)
    except subprocess.TimeoutExpired:
        gateway.signal(signal.SIGKILL)
        raise gateway.fail(f"still running {grace_s} s after SIGTERM") from None
    took = time.monotonic() - started
    assert code == 0, gateway.fail(f"exited {code} after SIGTERM")
    # Nothing is left for a successor: the emptyDir goes with the pod.
    missing = set(answered) - delivered(dev)
    assert not missing, f"{len(missing)} of {len(answered)} answered decisions left undelivered"
    assert not [p for p in _journals(gateway) if p.stat().st_size > HEADER_SIZE], "not drained"
    print(f"SIGTERM to exit: {took:.1f} s of {grace_s} s")
