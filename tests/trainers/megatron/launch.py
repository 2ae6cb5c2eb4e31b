"""A ``torch.multiprocessing`` launcher for the Megatron tests: N ranks over gloo,
each runs ``fn(rank, world, *args)``; rank 0's return value comes back."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentgym.trainers.ranks import deal, split_rows
from agentgym.trajectory import RolloutBatch


def _entry(rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()
    # The rank's work is done and saved: leave without the interpreter's teardown.
    # About one run in six, a C++ static destructor at that teardown met a thread
    # still joinable ("terminate called without an active exception", SIGABRT,
    # no Python frame), which failed a test whose ranks had all finished.
    # Leaving that way skips multiprocessing's own exit handler, so end the processes
    # the rank started (megatron-core's checkpoint writers) here, or they stay behind.
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(10)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(world: int, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` on ``world`` fresh processes; rank 0's result."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(_entry, args=(world, port, out, fn, args), nprocs=world, join=True)
        return torch.load(out, weights_only=False)


class Dealt:
    """A rank's strategy behind what the trainer worker group does, with its own
    functions: micro-batches dealt in contiguous shares (:func:`deal`), rows split
    over the ranks (:func:`split_rows`, an empty share where there are fewer rows
    than ranks), the shares' results concatenated in rank order (see
    :class:`~agentgym.trainers.ranks.RankGroup`)."""

    def __init__(self, strategy: Any, rank: int, world: int) -> None:
        self.strategy, self.rank, self.world = strategy, rank, world

    def train_step(self, micro_batches: Sequence[RolloutBatch], loss_fn: Any) -> Any:
        return self.strategy.train_step(deal(list(micro_batches), self.world)[self.rank], loss_fn)

    def _rows(self, method: str, batch: RolloutBatch, budget: Any) -> torch.Tensor:
        part = split_rows(batch, self.world)[self.rank]
        mine = getattr(self.strategy, method)(part, budget)
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, mine)
        width = batch.input_ids.shape[1]
        return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in gathered])

    def logprobs(self, batch: RolloutBatch, budget: Any = None) -> torch.Tensor:
        return self._rows("logprobs", batch, budget)

    def reference_logprobs(self, batch: RolloutBatch, budget: Any = None) -> torch.Tensor:
        return self._rows("reference_logprobs", batch, budget)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.strategy, name)


def model_dir(path: Path) -> Path:
    """A tiny Qwen2 folder (hidden 64, 2 layers, head_dim 32, GQA 4:2, qkv bias)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape: dict[str, Any] = {
        "vocab_size": 101,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 64,
        "rope_theta": 5000.0,
        "tie_word_embeddings": False,
    }
    model = Qwen2ForCausalLM(Qwen2Config(**shape))
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.1)
    model.save_pretrained(path)
    return path
