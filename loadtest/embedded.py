"""Prototype for the benchmarks: a gateway that reads Redis and runs the model in process.

It answers ``fraud.v1.FraudScoring/Score`` with the real gateway's code (servicer,
validation, budget, breakers, pipeline, rules, metrics) but with two injected clients
instead of the two gRPC hops: ``RedisFeatureClient`` reads both feature hashes in one
pipelined Redis round trip (the keys and hashed field names Feast writes, computed once),
and ``InProcessModel`` runs the same ONNX model with ONNX Runtime in the gateway process.
On a machine where every Python gRPC call costs most of a millisecond of CPU, this removes
two client calls and two server calls per Score. It exists to measure that proposal
(``python -m loadtest.embedded``); the services are unchanged.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from feast.infra.online_stores.helpers import _mmh3, _redis_key
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import Field
from pydantic_settings import SettingsConfigDict
from redis import asyncio as aioredis

from loadtest import data, ghz, report, runner
from loadtest.priority import normal_priority
from services.common import envoy, featurespec, registry
from services.common.server import serve
from services.features import store as feature_store
from services.features.feature_repo import definitions
from services.features.settings import FeaturesSettings
from services.gateway.pipeline import DependencyError, Pipeline
from services.gateway.rules import DEFAULT_RULES, RulesEngine
from services.gateway.service import GatewayService
from services.gateway.settings import GatewaySettings
from services.mesh import Process, free_port, grpc_serving, tcp_open
from services.scorer.model import OnnxModel


class EmbeddedSettings(GatewaySettings):
    """The gateway's settings plus where Redis is (env prefix ``FRAUD_GATEWAY_``)."""

    model_config = SettingsConfigDict(env_prefix="FRAUD_GATEWAY_", extra="ignore", frozen=True)

    redis_host: str = Field("127.0.0.1", description="Redis host of the online store.")
    redis_port: int = Field(6379, description="Redis port of the online store.")
    project: str = Field("fraudmesh", description="Feast project (part of every key).")


class RedisFeatureClient:
    """Store features of a card and a merchant in one pipelined HMGET round trip."""

    def __init__(self, host: str, port: int, project: str) -> None:
        self._redis = aioredis.Redis(host=host, port=port)
        self._project = project
        self._views = (
            (
                "card_id",
                [_mmh3(f"{featurespec.CARD_VIEW}:{n}") for n in featurespec.CARD_FEATURES]
                + [f"_ts:{featurespec.CARD_VIEW}".encode()],
                featurespec.CARD_FEATURES,
                definitions.CARD_TTL.total_seconds(),
            ),
            (
                "merchant_id",
                [_mmh3(f"{featurespec.MERCHANT_VIEW}:{n}") for n in featurespec.MERCHANT_FEATURES]
                + [f"_ts:{featurespec.MERCHANT_VIEW}".encode()],
                featurespec.MERCHANT_FEATURES,
                definitions.MERCHANT_TTL.total_seconds(),
            ),
        )

    def _key(self, join_key: str, value: str) -> bytes:
        entity = EntityKey(join_keys=[join_key], entity_values=[Value(string_val=value)])
        return _redis_key(self._project, entity, 3)

    async def get(
        self, card_id: str, merchant_id: str, as_of_s: float, timeout_s: float
    ) -> Mapping[str, float | None]:
        """Fresh values by name; None for missing or stale ones."""
        pipe = self._redis.pipeline(transaction=False)
        for (join_key, fields, _, _), value in zip(
            self._views, (card_id, merchant_id), strict=True
        ):
            # redis-py takes bytes keys though its stubs say str.
            pipe.hmget(self._key(join_key, value), fields)  # type: ignore[arg-type]
        try:
            replies = await pipe.execute()
        except Exception as error:
            raise DependencyError("features", "unavailable", str(error)) from error
        out: dict[str, float | None] = {}
        for (_, _, names, max_age), values in zip(self._views, replies, strict=True):
            stamp = Timestamp()
            if values[-1]:
                stamp.ParseFromString(values[-1])
            fresh = bool(values[-1]) and as_of_s - stamp.seconds <= max_age
            for name, raw in zip(names, values[:-1], strict=True):
                parsed = Value.FromString(raw).ListFields() if fresh and raw else ()
                out[name] = float(parsed[0][1]) if parsed else None
        return out

    async def close(self) -> None:
        """Closes the connection pool."""
        await self._redis.aclose()


class InProcessModel:
    """The published ONNX model run in the gateway process (about 10 µs a row)."""

    def __init__(self, model: OnnxModel) -> None:
        self._model = model
        self._row = np.empty((1, model.n_features), dtype=np.float32)

    async def score(self, vector: list[float], timeout_s: float) -> float:
        """Fraud probability of one row."""
        self._row[0] = vector
        return float(self._model.predict(self._row)[0])


class EmbeddedGatewayService(GatewayService):
    """The gateway with the feature read and the model in process."""

    name = "gateway-embedded"

    def __init__(self, settings: EmbeddedSettings) -> None:
        super().__init__(settings)
        self.embedded = settings
        self.features: RedisFeatureClient | None = None

    async def start(self) -> None:
        """Loads metadata, rules and the ONNX session, connects Redis, warms up."""
        s = self.embedded
        metadata, _ = registry.load(s.models_path, s.model_name, s.model_version)
        rules = RulesEngine.load(s.rules_path or DEFAULT_RULES, metadata.feature_order)
        model = OnnxModel.load(s.models_path, s.model_name, s.model_version)
        model.warm_up(20)
        self.features = RedisFeatureClient(s.redis_host, s.redis_port, s.project)
        pipeline = Pipeline(
            metadata,
            rules,
            self.features,
            InProcessModel(model),
            self.metrics,
            self._breaker("features", s.features_slow_ms),
            self._breaker("scorer", s.scorer_slow_ms),
        )
        await self._warm_up(pipeline)
        self.servicer.pipeline = pipeline

    async def close(self) -> None:
        """Closes the Redis pool."""
        if self.features is not None:
            await self.features.close()


def measure(var_dir: Path, out_dir: Path, rates: Sequence[int], step_s: float = 10.0) -> Path:
    """Envoy + the embedded gateway + Redis, Score at each rate; writes bench-embedded.md."""
    work = out_dir / ".bench-embedded.tmp"
    redis_port, gw_port, envoy_port, admin_port, metrics_port = (free_port() for _ in range(5))
    redis = Process(
        "redis",
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        ready=lambda: tcp_open("127.0.0.1", redis_port),
        log_path=work / "redis.log",
    )  # fmt: skip
    gateway = Process(
        "gateway",
        [sys.executable, "-m", "loadtest.embedded", "serve"],
        ready=lambda: grpc_serving(f"127.0.0.1:{gw_port}"),
        env={
            "FRAUD_GATEWAY_PORT": str(gw_port),
            "FRAUD_GATEWAY_VAR_DIR": str(var_dir),
            "FRAUD_GATEWAY_REDIS_PORT": str(redis_port),
            "FRAUD_GATEWAY_METRICS_PORT": str(metrics_port),
        },
        log_path=work / "gateway.log",
    )
    config = work / "envoy.yaml"
    edge = Process(
        "envoy",
        envoy.envoy_command(config),
        ready=lambda: grpc_serving(f"127.0.0.1:{envoy_port}"),
        log_path=work / "envoy.log",
    )
    procs = (redis, gateway, edge)
    try:
        work.mkdir(parents=True, exist_ok=True)
        config.write_text(
            envoy.render_config(
                listen_port=envoy_port,
                admin_port=admin_port,
                gateway_port=gw_port,
                rate_limit_rps=100_000,
                access_log_path=str(work / "envoy-access.log"),
            )
        )
        redis.start()
        redis.wait_ready(30)
        feature_store.materialize(
            FeaturesSettings(
                var_dir=var_dir, store="redis", redis_connection=f"127.0.0.1:{redis_port}"
            )
        )
        for process in (gateway, edge):
            process.start()
            process.wait_ready(120)
        pids = {p.name: p.pid or 0 for p in procs}
        normal_priority(list(pids.values()))
        population = data.sample_population(var_dir / "data", 2000)
        steps = runner.run_schedule(
            ghz.SCORE,
            f"127.0.0.1:{envoy_port}",
            lambda: data.write_data_file(work / "score.json", data.score_requests(population)),
            rates,
            step_s=step_s,
            timeout_ms=42.0,
            pids=pids,
            warmup_s=3.0,
            saturated_steps=2,
            dead=lambda: [p.name for p in procs if not p.alive()],
            answers=runner.gateway_answers(f"http://127.0.0.1:{metrics_port}/metrics"),
        )
    finally:
        for process in reversed(procs):
            process.stop()
    results = [s.result for s in steps]
    png = report.plot(
        {"embedded gateway (Redis)": results},
        out_dir / "bench-embedded.png",
        "Prototype: features and model in the gateway process, Score through Envoy",
    )
    best = report.max_sustainable(results)
    at400 = report.at_rate(results, 400)
    lines = [
        "# Prototype: the gateway with the feature read and the model in process",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {runner.machine_line()}.",
        "",
        "Envoy → one gateway process (the real servicer, pipeline, rules, breakers and "
        "metrics) that reads both feature hashes from Redis in one pipelined HMGET and "
        "runs the ONNX model in process (`loadtest/embedded.py`). Same data, mix, deadline "
        f"(42 ms) and ghz settings as the load test, {step_s:g} s per step.",
        "",
        report.steps_table(steps, list(pids)),
        "",
        report.cpu_table(steps),
        "",
        f"![latency percentiles vs rate]({png.name})",
        "",
    ]
    if at400 is not None:
        lines.append(
            f"- p99 at 400 rps: {at400.p99_ms:.2f} ms, errors {at400.error_share:.2%} "
            f"(target ≤ 10 ms, 0 errors: {'met' if at400.ok(10.0) else 'missed'})"
        )
    lines.append(
        "- highest sustained rate (p99 ≤ 42 ms, 0 errors): "
        + (f"{best.offered_rps:.0f} rps" if best else "none")
    )
    md = out_dir / "bench-embedded.md"
    md.write_text("\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return md


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m loadtest.embedded serve`` runs the gateway; ``measure`` runs the bench."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["serve", "measure"])
    parser.add_argument("--var-dir", type=Path, default=Path("var"))
    parser.add_argument("--out", type=Path, default=runner.RESULTS_DIR)
    parser.add_argument("--rates", default="200,400,600,700,800,1000,1200")
    parser.add_argument("--step-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        settings = EmbeddedSettings()
        serve(settings, EmbeddedGatewayService(settings))
        return
    rates = [int(r) for r in args.rates.split(",")]
    print(measure(args.var_dir, args.out, rates, args.step_seconds).read_text())


if __name__ == "__main__":
    main()
