"""Print WebShop's figures: build and index time, search latency, step throughput, memory.

Each catalog size runs in its own process (so its peak memory is its own),
with a fresh cache folder: generation, catalog build and BM25 indexing are
timed cold, then the shop is loaded again from the disk cache. Then: search
latency p50/p99 over the instructions of the first goals, env steps per second
of the oracle agent, recall@10/@50 of the goal product over 500 test goals,
the oracle's success rate on 200 eval goals, and the peak resident memory.

    python benchmarks/webshop_figures.py [--sizes 1000 100000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np


def measure(num_products: int, cache_dir: str, queries: int) -> dict[str, Any]:
    """All figures for one catalog size (runs in the worker process)."""
    from agentgym.envs.webshop import WebShopEnv, build_catalog, generate_catalog
    from agentgym.envs.webshop.search import SearchEngine
    from agentgym.envs.webshop.world import _load, load_world

    figures: dict[str, Any] = {"num_products": num_products}
    start = time.perf_counter()
    raw = generate_catalog(num_products, 0)
    figures["generate_s"] = time.perf_counter() - start
    start = time.perf_counter()
    catalog = build_catalog(raw.items, raw.attributes, reviews=raw.reviews)
    figures["catalog_s"] = time.perf_counter() - start
    start = time.perf_counter()
    SearchEngine.build(catalog)
    figures["index_s"] = time.perf_counter() - start
    del raw, catalog

    start = time.perf_counter()
    load_world(num_products=num_products, cache_dir=cache_dir)  # cold: generate, write, index
    figures["first_load_s"] = time.perf_counter() - start
    _load.cache_clear()
    start = time.perf_counter()
    world = load_world(num_products=num_products, cache_dir=cache_dir)  # from the disk cache
    figures["cached_load_s"] = time.perf_counter() - start

    count = min(queries, len(world.goals))
    instructions = [world.goals[i].instruction.lower() for i in range(count)]
    latencies = []
    for text in instructions:
        start = time.perf_counter()
        world.engine.search(text)
        latencies.append(time.perf_counter() - start)
    figures["search_p50_ms"] = 1000 * float(np.percentile(latencies, 50))
    figures["search_p99_ms"] = 1000 * float(np.percentile(latencies, 99))

    hits10 = hits50 = 0
    recalled = min(500, len(world.goals))
    for position in range(recalled):
        goal = world.goals[position]
        results = world.engine.search(goal.instruction.lower())
        target = world.catalog.index[goal.asin]
        hits10 += target in results[:10]
        hits50 += target in results[:50]
    figures["recall_at_10"] = hits10 / recalled
    figures["recall_at_50"] = hits50 / recalled

    env = WebShopEnv(num_products=num_products, cache_dir=cache_dir, split="eval")
    successes = steps = 0
    start = time.perf_counter()
    for index in range(200):
        env.reset(options={"goal_index": index})
        done = False
        while not done:
            *_, terminated, truncated, info = env.step(env.oracle_response())
            done = terminated or truncated
        successes += info["success"]
        steps += env.num_steps
    elapsed = time.perf_counter() - start
    figures["oracle_success"] = successes / 200
    figures["oracle_steps_per_s"] = steps / elapsed
    figures["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--queries", type=int, default=1000, help="searches timed per size")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help="tiny: 200 products, 50 queries")
    args = parser.parse_args()
    if args.dry_run:
        args.sizes, args.queries = [200], 50
    if args.worker is not None:
        print(json.dumps(measure(args.worker, args.cache, args.queries)))
        return

    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as cache:
            command = [sys.executable, __file__, "--worker", str(size), "--cache", cache]
            command += ["--queries", str(args.queries)]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(output.strip().splitlines()[-1]))
    columns = [
        ("products", "num_products", "{:,}"),
        ("generate s", "generate_s", "{:.2f}"),
        ("catalog s", "catalog_s", "{:.2f}"),
        ("index s", "index_s", "{:.2f}"),
        ("first load s", "first_load_s", "{:.2f}"),
        ("cached load s", "cached_load_s", "{:.2f}"),
        ("search p50 ms", "search_p50_ms", "{:.3f}"),
        ("search p99 ms", "search_p99_ms", "{:.3f}"),
        ("R@10", "recall_at_10", "{:.3f}"),
        ("R@50", "recall_at_50", "{:.3f}"),
        ("oracle", "oracle_success", "{:.3f}"),
        ("steps/s", "oracle_steps_per_s", "{:,.0f}"),
        ("peak RSS MiB", "peak_rss_mib", "{:,.0f}"),
    ]
    print(" | ".join(name for name, _, _ in columns))
    for row in rows:
        print(" | ".join(fmt.format(row[key]) for _, key, fmt in columns))
    if args.json:
        machine = {"python": platform.python_version(), "machine": platform.machine()}
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
