"""The live writer's SQLite path: its own upserts against Feast's ``online_write_batch``.

The feature updater writes, after each poll of the event log, the rows of the cards,
merchants and terminals the poll's events changed. At a few hundred events a second a poll
holds one or a few events, so a write is one card, one merchant and one terminal row; under
a backlog it holds hundreds. For each batch size, ``--rounds`` rounds write ``--writes``
batches of distinct entities through each path in turn (the order alternating), each path
on its own fresh copy of the prepared state, and report the CPU of this process per write
and per row (medians over the rounds).

    python -m loadtest.writer_bench --var-dir var [--rounds 5] [--writes 400] [--sizes 1,10,100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest import provenance
from loadtest.runner import copy_state
from services.domain import featurespec
from services.featurestore.settings import FeatureStoreSettings
from services.featurestore.writer import OnlineFeatureWriter, Row

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "writer-sqlite"
PATHS = ("direct", "feast")


def _rows(names: tuple[str, ...], prefix: str, count: int, now: float) -> list[Row]:
    return [
        Row(f"{prefix}-{i}", now - i * 1e-3, {n: float(j + i) for j, n in enumerate(names)})
        for i in range(count)
    ]


def _cpu_per_write(writer: OnlineFeatureWriter, size: int, writes: int, tag: str) -> float:
    """CPU µs of this process per write of ``size`` entities of each view."""
    now = time.time()
    batches = [
        (
            _rows(featurespec.CARD_FEATURES, f"card-{tag}-{w}", size, now),
            _rows(featurespec.MERCHANT_FEATURES, f"merch-{tag}-{w}", size, now),
            _rows(featurespec.TERMINAL_FEATURES, f"term-{tag}-{w}", size, now),
        )
        for w in range(writes)
    ]
    start = time.process_time()
    for cards, merchants, terminals in batches:
        writer.write(cards, merchants, terminals)
    return (time.process_time() - start) / writes * 1e6


def measure(var_dir: Path, rounds: int, writes: int, sizes: list[int]) -> dict[str, Any]:
    """CPU per write of each path and batch size, round by round."""
    per_size: dict[int, dict[str, list[float]]] = {s: {p: [] for p in PATHS} for s in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        writers = {}
        for path in PATHS:
            settings = FeatureStoreSettings(
                var_dir=copy_state(var_dir, Path(tmp) / path), store="sqlite"
            )
            writer = OnlineFeatureWriter(settings)
            if path == "feast":
                writer._sqlite_upserts = None  # Feast's own online_write_batch
            writers[path] = writer
        try:
            for r in range(rounds):
                order = PATHS if r % 2 == 0 else PATHS[::-1]
                for size in sizes:
                    for path in order:
                        cpu = _cpu_per_write(writers[path], size, writes, f"{r}-{size}")
                        per_size[size][path].append(cpu)
        finally:
            for writer in writers.values():
                writer.close()
    rows_per_write = 3
    return {
        "rounds": rounds,
        "writes_per_round": writes,
        "sizes": {
            str(size): {
                **{
                    path: {
                        "cpu_us_per_write": statistics.median(values),
                        "cpu_us_per_row": statistics.median(values) / (size * rows_per_write),
                        "cpu_us_rounds": [round(v, 1) for v in values],
                    }
                    for path, values in paths.items()
                },
                "direct_over_feast": _paired(paths["direct"], paths["feast"]),
            }
            for size, paths in per_size.items()
        },
    }


def _paired(direct: list[float], feast: list[float]) -> dict[str, Any]:
    """The two paths' ratio round by round (the same round's machine), and its median."""
    ratios = [d / f for d, f in zip(direct, feast, strict=True)]
    return {"median": statistics.median(ratios), "rounds": [round(r, 3) for r in ratios]}


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The live writer on SQLite: its own upserts against Feast's online_write_batch",
        "",
        f"{result['rounds']} rounds of {result['writes_per_round']} writes per batch size and "
        "path, the paths taking turns, each on a fresh copy of the prepared state. A write "
        "holds that many cards, merchants and terminals (each of their features one row of "
        "the store's table). CPU of this process; medians over the rounds.",
        "",
        "| entities per view | path | CPU µs per write | CPU µs per entity row | "
        "direct/feast (median of the rounds' ratios) | CPU µs per round |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for size, paths in result["sizes"].items():
        paired = paths["direct_over_feast"]
        for path in PATHS:
            row = paths[path]
            ratio = f"{paired['median']:.2f}× ({', '.join(f'{r:.2f}' for r in paired['rounds'])})"
            ratio = ratio if path == "direct" else "base"
            rounds = ", ".join(f"{v:.0f}" for v in row["cpu_us_rounds"])
            lines.append(
                f"| {size} | {path} | {row['cpu_us_per_write']:.0f} | "
                f"{row['cpu_us_per_row']:.1f} | {ratio} | {rounds} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measures and writes the results files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, required=True, help="prepared state (make data)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--sizes", default="1,10,100", help="entities per view per write")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result = measure(args.var_dir, args.rounds, args.writes, sizes)
    prov = provenance.record()
    paths = provenance.write(RESULTS / STEM, result, _markdown(result), prov)
    print(_markdown(result))
    print("written:", *paths)


if __name__ == "__main__":
    main()
