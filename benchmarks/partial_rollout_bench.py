"""``partial_rollout`` against the other ways a weight sync meets the responses being
generated, on a simulated engine with long-tailed response lengths.

64 episodes generate responses back to back through the real
:class:`~agentgym.rollout.async_rollout.PausableBackend`; a trainer syncs the weights
every ``--train`` seconds (each sync takes ``--update`` seconds once generation has
stopped). The engine makes a token every ``--token-ms`` per request (requests run side
by side, as an engine batches them); each response's length is log-normal (median
``--median`` tokens, σ ``--sigma``, capped at ``--max-tokens``). Three ways:

- ``drain``: a sync waits for the responses in flight to finish (on the old weights:
  agentgym's default, ``partial_rollout=0``);
- ``regenerate``: a sync aborts them, and each is generated again from its prompt on
  the new weights (their tokens so far are thrown away);
- ``continue``: responses are generated ``--chunk`` tokens at a time; a sync stops each
  at its piece's end, and it goes on on the new weights with its tokens kept
  (``partial_rollout=<chunk>``).

Figures per way: the trainer's wait for generation to stop at a sync (mean and max),
its step time (training + that wait + the update), tokens the engine generated per
token kept (the tokens of requests a sync aborted are thrown away), and finished
responses per second.

    python benchmarks/partial_rollout_bench.py [--syncs 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tables import print_table

from agentgym.rollout.async_rollout import PausableBackend, paused_update
from agentgym.rollout.backends.base import Generation, SamplingParams


@dataclass
class Settings:
    episodes: int = 64
    token_ms: float = 2.0
    median: float = 48.0
    sigma: float = 1.0
    max_tokens: int = 512
    chunk: int = 32
    train: float = 0.5
    update: float = 0.05
    syncs: int = 12


class LongTailEngine:
    """Makes a response token by token (``token_ms`` apart, requests side by side); a
    response's length is drawn per episode (the prompt's first id) and turn. Counts every
    token it makes, and apart those of requests a sync cancelled (thrown away)."""

    def __init__(self, settings: Settings, seed: int = 0) -> None:
        self.settings = settings
        self.random = random.Random(seed)
        self.lengths: dict[tuple[int, int], int] = {}
        self.generated = 0
        self.thrown_away = 0
        self.closing = False

    def length(self, episode: int, turn: int) -> int:
        key = (episode, turn)
        if key not in self.lengths:
            s = self.settings
            drawn = s.median * math.exp(self.random.gauss(0.0, s.sigma))
            self.lengths[key] = max(1, min(s.max_tokens, round(drawn)))
        return self.lengths[key]

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        episode, turn, done = prompt_ids[0], prompt_ids[1], len(prompt_ids) - 2
        target = self.length(episode, turn)
        count = min(params.max_new_tokens, target - done)
        ids: list[int] = []
        try:
            for _ in range(count):
                await asyncio.sleep(self.settings.token_ms / 1000)
                ids.append(1)
                self.generated += 1
        except asyncio.CancelledError:
            if not self.closing:  # cut by a sync, not by the end of the run
                self.thrown_away += len(ids)
            raise
        finish = "stop" if done + len(ids) >= target else "length"
        return Generation(ids, [-1.0] * len(ids), finish)

    async def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        await asyncio.sleep(self.settings.update)

    async def close(self) -> None:
        return None


async def run(way: str, settings: Settings) -> dict[str, float]:
    engine = LongTailEngine(settings)
    client = PausableBackend(engine, chunk=settings.chunk if way == "continue" else 0)
    params = SamplingParams(max_new_tokens=settings.max_tokens)
    finished = 0
    stop = asyncio.Event()

    async def episode(index: int) -> None:
        nonlocal finished
        turn = 0
        while not stop.is_set():
            await client.generate([index, turn], params)
            finished += 1
            turn += 1

    tasks = [asyncio.ensure_future(episode(i)) for i in range(settings.episodes)]
    waits, steps = [], []
    started = time.perf_counter()
    for _ in range(settings.syncs):
        step_started = time.perf_counter()
        await asyncio.sleep(settings.train)  # the trainer trains while episodes generate
        times = await paused_update(
            client,
            lambda: engine.update_weights([]),
            timeout=600,
            abort=way == "regenerate",
        )
        waits.append(times["time/weight_sync_pause"])
        steps.append(time.perf_counter() - step_started)
    seconds = time.perf_counter() - started
    engine.closing = True
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "sync_wait_mean_s": statistics.mean(waits),
        "sync_wait_max_s": max(waits),
        "step_s": statistics.mean(steps),
        "generated_per_kept_token": engine.generated
        / max(engine.generated - engine.thrown_away, 1),
        "responses_per_s": finished / seconds,
        "continued": float(client.continued),
        "aborted": float(client.aborted),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="tiny: 8 episodes, 2 syncs")
    args = parser.parse_args(argv)
    settings = Settings(**{k: getattr(args, k) for k in vars(defaults)})
    if args.dry_run:
        settings = replace(settings, episodes=8, syncs=2, train=0.1, max_tokens=64)
    figures = {way: asyncio.run(run(way, settings)) for way in ("drain", "regenerate", "continue")}
    print(
        f"{settings.episodes} episodes, {settings.syncs} syncs every {settings.train} s of "
        f"training, lengths log-normal (median {settings.median:g}, sigma {settings.sigma:g}, "
        f"cap {settings.max_tokens}), {settings.token_ms:g} ms a token, pieces of {settings.chunk}"
    )
    print_table(
        (
            "way",
            "sync wait mean / max s",
            "step s",
            "tokens generated per token kept",
            "responses/s",
        ),
        [
            (
                way,
                f"{f['sync_wait_mean_s']:.3f} / {f['sync_wait_max_s']:.3f}",
                f"{f['step_s']:.3f}",
                f"{f['generated_per_kept_token']:.3f}",
                f"{f['responses_per_s']:.1f}",
            )
            for way, f in figures.items()
        ],
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
