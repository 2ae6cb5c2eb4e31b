"""Padded tokens with and without dynamic batching on a ragged batch (no model needed).

A mini-batch of ROLL's ``agentic_val_sokoban_dynamic_batching`` shape (128 samples:
``per_device_train_batch_size`` 2 × ``gradient_accumulation_steps`` 64), each
sample a multi-turn episode of 1 to 10 turns: a 300-token first prompt, then per turn
a 60-100-token observation and a 20-100-token response (seeded). It is cut into
micro-batches three ways, and each cut's forward passes counted: the tokens computed
beyond the real ones (padding) and their share of all computed tokens::

    python benchmarks/dynamic_batching_figures.py [--samples 128] [--seed 0]

- every row padded to ``sequence_length`` (8192): ROLL's tensors without dynamic
  batching, the baseline of its ``dynamic_batching/removed_padding_ratio``;
- fixed: 2 rows per micro-batch in the batch's (random) order, each micro-batch
  trimmed to its longest row, as here without dynamic batching
  (:func:`~agentgym.trainers.strategies.base.micro_batches`);
- dynamic: rows sorted by length, cut by a token budget, widths rounded up
  (:mod:`agentgym.trainers.strategies.batching`).
"""

from __future__ import annotations

import argparse

import torch

from agentgym.trainers.strategies import micro_batches
from agentgym.trainers.strategies.batching import TokenBudget, padded_tokens, token_micro_batches
from agentgym.trajectory import RolloutBatch

SEQUENCE_LENGTH = 8192


def episode_lengths(samples: int, seed: int) -> torch.Tensor:
    """``[samples]`` token counts of multi-turn episodes (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    turns = torch.randint(1, 11, (samples,), generator=generator)
    lengths = torch.full((samples,), 300)
    for index, count in enumerate(turns.tolist()):
        observations = torch.randint(60, 101, (count,), generator=generator)
        responses = torch.randint(20, 101, (count,), generator=generator)
        lengths[index] += int(observations.sum() + responses.sum())
    return lengths


def batch_of(lengths: torch.Tensor) -> RolloutBatch:
    """Right-padded rows of ``lengths`` real tokens (the ids do not matter here)."""
    width = int(lengths.max())
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()  # [B, T]
    zeros = torch.zeros(len(lengths), width)
    return RolloutBatch(
        input_ids=attention.clone(),
        attention_mask=attention,
        position_ids=torch.arange(width).expand(len(lengths), width) * attention,
        loss_mask=attention,
        engine_logprobs=zeros,
        token_rewards=zeros,
        scores=torch.zeros(len(lengths)),
        group_ids=torch.zeros(len(lengths), dtype=torch.long),
        tags=["t"] * len(lengths),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="tiny: 16 samples")
    args = parser.parse_args()
    if args.dry_run:
        args.samples = 16
    lengths = episode_lengths(args.samples, args.seed)
    batch = batch_of(lengths)
    real = int(lengths.sum())
    print(
        f"{args.samples} samples, {real} real tokens; lengths {int(lengths.min())}-"
        f"{int(lengths.max())}, mean {float(lengths.float().mean()):.0f}"
    )
    rows: list[tuple[str, int, int]] = [
        ("every row padded to 8192", args.samples * SEQUENCE_LENGTH - real, args.samples)
    ]
    parts = list(micro_batches(batch, 2))
    rows.append(("fixed: 2 rows, trimmed", padded_tokens(parts)[0], len(parts)))
    for max_tokens, round_to in ((8192, 128), (8192, 1), (16384, 128)):
        parts = token_micro_batches(batch, TokenBudget(max_tokens, round_to))
        name = f"dynamic: {max_tokens} tokens, round {round_to}"
        rows.append((name, padded_tokens(parts)[0], len(parts)))
    print("| cut | micro-batches | padded tokens | padded share |\n| --- | ---: | ---: | ---: |")
    for name, padded, count in rows:
        print(f"| {name} | {count} | {padded} | {padded / (padded + real):.1%} |")


if __name__ == "__main__":
    main()
