"""Helpers of the weight-sync benchmark: the models (the tiny one and a Qwen2.5-0.5B-shaped
one with random weights, both built here) and one measured sync through the router."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.models.tiny import TinyModelSpec, build_tiny_model, env_corpus
from agentgym.rollout.router import Router

QWEN25_05B: dict[str, Any] = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
"""Qwen2.5-0.5B's shape (494M parameters: 1.98 GB in float32)."""


def build_tiny(path: Path) -> Path:
    """The tests' tiny model (2 layers, width 128; 2.4 MB in float32)."""
    return build_tiny_model(env_corpus(), TinyModelSpec(), path)


def build_qwen05b_shaped(path: Path, tokenizer_from: Path, *, tied: bool = True) -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights, and a tokenizer (copied from
    ``tokenizer_from``: engines need one; its ids all lie inside the vocabulary)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, path / name)
    config = Qwen2Config(**{**QWEN25_05B, "tie_word_embeddings": tied})
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
    model.tie_weights()
    model.save_pretrained(path)
    return path


@dataclass(frozen=True)
class SyncFigures:
    """Medians over rounds of one setting."""

    seconds: float
    pack_seconds: float
    transfer_seconds: float
    load_seconds: float
    buckets: int
    megabytes: float

    def row(self, label: str) -> str:
        """A Markdown table row."""
        return (
            f"| {label} | {self.megabytes:,.0f} | {self.buckets} | {self.seconds:.2f} | "
            f"{self.pack_seconds:.2f} | {self.transfer_seconds:.2f} | {self.load_seconds:.2f} | "
            f"{self.megabytes / self.seconds:,.0f} |"
        )


HEADER = (
    "| setting | MB | buckets | sync s | pack s | transfer s | load s | MB/s |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def measure_sync(router: Router, weights: dict[str, torch.Tensor], rounds: int) -> SyncFigures:
    """Sync ``weights`` through ``router`` ``rounds`` times; medians of the stats."""
    runs = []
    for _ in range(rounds):
        started = time.perf_counter()
        asyncio.run(router.update_weights(weights.items()))
        stats = router.last_sync
        assert stats is not None
        runs.append((time.perf_counter() - started, stats))
    return SyncFigures(
        seconds=statistics.median(seconds for seconds, _ in runs),
        pack_seconds=statistics.median(s.pack_seconds for _, s in runs),
        transfer_seconds=statistics.median(s.transfer_seconds for _, s in runs),
        load_seconds=statistics.median(s.load_seconds for _, s in runs),
        buckets=runs[0][1].buckets,
        megabytes=runs[0][1].num_bytes / 2**20,
    )


def logprob_gap(router: Router, model: Any, prompt: list[int], temperature: float = 0.7) -> float:
    """Largest gap between an engine's logprobs for its sample and ``model``'s."""
    from agentgym.rollout.backends.base import SamplingParams

    params = SamplingParams(temperature=temperature, max_new_tokens=8)
    result = asyncio.run(router.generate(prompt, params))
    ids = prompt + result.token_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature  # [T, V]
    targets = torch.tensor(result.token_ids)[:, None]  # [N, 1]
    reference = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, targets)[:, 0]
    return float((reference - torch.tensor(result.logprobs)).abs().max())
