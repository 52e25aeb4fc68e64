"""Where the model's reasons cost less: the gateway or the scorer, measured side by side.

``python -m loadtest.explain_bench --models DIR [--rounds 5] [--calls 400]`` loads the live
version of DIR and times, per call, in rounds that take turns on the same inputs:

- ``score``: the ONNX Runtime run every model answer pays (the reference);
- ``gateway``: the explanation as the gateway gives it, awaited from the event loop, with
  the reasons written (what a REVIEW or DECLINE adds there): from the version's
  contribution tables, on the loop itself;
- ``thread``: the same explanation handed to a worker thread and awaited (how the gateway
  runs LightGBM's TreeSHAP for a version the tables do not cover): what the hand-off costs;
- ``lightgbm``: ``gateway`` by LightGBM's own TreeSHAP (``pred_contrib``) instead of the
  tables (``services/models/treeshap.py``): what the tables save;
- ``scorer``: the explanation as the scorer would give it: the same TreeSHAP run, plus the
  contributions carried back as one more v2 output tensor (FP64 [1, n+1]: serialized in
  the scorer, parsed and decoded in the gateway) and the reasons written in the gateway;
- ``approval``: what an approval pays for the reasons: the pipeline's check and nothing else.

CPU time (``time.process_time``, the whole process: the worker thread's too) and wall time per
call; medians over the rounds. The inputs are the version's default features, each scaled by
a random log-normal factor (a new draw each round). Results: ``loadtest/results/explain-cost.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from inference import grpc_predict_v2_pb2 as v2
from loadtest import provenance
from services.gateway.explain import LocalExplainerProvider
from services.models import repository
from services.models.explain import DEFAULT_TOP_K, Explanation
from services.models.lifecycle import ModelLifecycle
from services.models.onnx import OnnxModel

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "explain-cost"
_ORDER = ("score", "gateway", "thread", "lightgbm", "scorer", "approval")
"""Every variant, in the order of even rounds (odd rounds reverse it)."""


def _inputs(metadata: repository.ModelMetadata, n: int, seed: int) -> list[list[float]]:
    """``n`` plausible inputs: the version's defaults, each scaled by a log-normal factor."""
    rng = np.random.default_rng(seed)
    base = np.array([metadata.default_features[f] for f in metadata.feature_order])
    rows = base * rng.lognormal(0.0, 1.0, size=(n, len(base)))
    return rows.astype(np.float32).astype(np.float64).tolist()


def _scorer_side(explanation: Explanation, response: v2.ModelInferResponse) -> Explanation:
    """The scorer's extra work and the gateway's: one more output tensor, there and back;
    the explanation as the gateway would rebuild it from the tensor."""
    values = [*(c.log_odds for c in explanation.contributions), explanation.base]
    reply = v2.ModelInferResponse()
    reply.CopyFrom(response)
    reply.outputs.add(name="contributions", datatype="FP64", shape=(1, len(values)))
    reply.raw_output_contents.append(struct.pack(f"<{len(values)}d", *values))
    received = v2.ModelInferResponse.FromString(reply.SerializeToString())
    back = struct.unpack(f"<{len(values)}d", received.raw_output_contents[1])
    shares = zip(explanation.contributions, back[:-1], strict=True)
    return Explanation(back[-1], tuple(replace(c, log_odds=x) for c, x in shares))


def _timed(work: Callable[[list[float]], Any], inputs: list[list[float]]) -> tuple[float, float]:
    """CPU and wall microseconds per call of ``work`` over ``inputs``."""
    cpu, wall = time.process_time(), time.perf_counter()
    for row in inputs:
        work(row)
    n = len(inputs)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def _rounds(model_root: Path, rounds: int, calls: int) -> dict[str, Any]:
    lifecycle = ModelLifecycle(model_root)
    live = lifecycle.read().routing.live
    metadata, folder = repository.load(model_root, version=live)
    onnx = OnnxModel(metadata, folder)
    provider = LocalExplainerProvider(model_root)
    explainer = await provider.prepare(metadata)
    if explainer is None:
        raise SystemExit(f"v{metadata.version} keeps no booster text: nothing to measure")
    trees = explainer.trees
    template = v2.ModelInferResponse(model_name=metadata.name, model_version=metadata.version)
    template.raw_output_contents.append(struct.pack("<2f", 0.9, 0.1))

    def score(row: list[float]) -> None:
        onnx.predict(np.asarray([row], dtype=np.float32))

    def by_lightgbm(row: list[float]) -> None:
        trees.explain_by_predict(row).reasons(DEFAULT_TOP_K)

    def scorer(row: list[float]) -> None:
        _scorer_side(trees.explain(row), template).reasons(DEFAULT_TOP_K)

    def approval(row: list[float]) -> None:
        # The pipeline's whole cost for an approval: the checks before any explanation.
        _ = explainer is None or DEFAULT_TOP_K <= 0 or row[0] > 1.0

    worker = ThreadPoolExecutor(max_workers=1)

    async def awaited(inputs: list[list[float]], thread: bool) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for row in inputs:
            if thread:
                done = asyncio.wrap_future(worker.submit(trees.explain, row))
                explanation = await asyncio.wait_for(done, 1.0)
            else:
                explanation = await explainer.explain(row, 1.0)
            explanation.reasons(DEFAULT_TOP_K)
        n = len(inputs)
        return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6

    figures: dict[str, list[tuple[float, float]]] = {}
    for r in range(rounds):
        inputs = _inputs(metadata, calls, seed=r)
        # Each round reverses the order, so the machine's drift falls on every variant alike.
        for name in _ORDER if r % 2 == 0 else list(reversed(_ORDER)):
            if name in ("gateway", "thread"):
                figures.setdefault(name, []).append(await awaited(inputs, name == "thread"))
            else:
                work = {
                    "score": score,
                    "lightgbm": by_lightgbm,
                    "scorer": scorer,
                    "approval": approval,
                }
                figures.setdefault(name, []).append(_timed(work[name], inputs))
    provider.close()
    worker.shutdown()
    return {
        "model_version": metadata.version,
        "features": len(metadata.feature_order),
        "trees": trees.num_trees,
        "tabulated": trees.tabulated,
        "rounds": rounds,
        "calls_per_round": calls,
        "per_call_us": {
            name: {
                "cpu_median": statistics.median(c for c, _ in values),
                "wall_median": statistics.median(w for _, w in values),
                "cpu_rounds": [round(c, 1) for c, _ in values],
            }
            for name, values in figures.items()
        },
    }


def _markdown(result: dict[str, Any]) -> str:
    rows = result["per_call_us"]
    lines = [
        "# The model's reasons: cost per call, gateway against scorer",
        "",
        f"Version v{result['model_version']} ({result['features']} features, "
        f"{result['trees']} trees); {result['rounds']} rounds of "
        f"{result['calls_per_round']} calls, taking turns. Microseconds per call; medians "
        "over the rounds (CPU of this process, then wall).",
        "",
        "| what | CPU µs | wall µs | CPU per round |",
        "|---|---:|---:|---|",
    ]
    for name in _ORDER:
        row = rows[name]
        per_round = ", ".join(f"{v:.0f}" for v in row["cpu_rounds"])
        lines.append(
            f"| {name} | {row['cpu_median']:.1f} | {row['wall_median']:.1f} | {per_round} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True, help="the model registry folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args(argv)
    result = asyncio.run(_rounds(args.models, args.rounds, args.calls))
    prov = provenance.record()
    paths = provenance.write(RESULTS / STEM, result, _markdown(result), prov)
    print(_markdown(result))
    print("written:", *paths)


if __name__ == "__main__":
    main()
