"""The suite's settings (full on a GPU, tiny for ``--dry-run``) and its model folders.

Models have random weights in published shapes: :data:`agentgym.plan.shapes.SHAPES`
holds Qwen2.5-0.5B's and -1.5B's ``config.json`` fields. Each folder gets the tests'
tiny byte-level BPE tokenizer and ChatML template (:mod:`agentgym.models.tiny`):
engines and the recipe need one, and its few hundred ids all lie inside the vocabulary.
Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.plan.shapes import SHAPES, ModelShape, load_shape

TINY = "tiny"
"""The dry run's shape: the tests' tiny model (2 layers, width 128)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@dataclass(frozen=True)
class Settings:
    """What every item runs with.

    Attributes:
        device: ``cuda`` or ``cpu``.
        dtype: Parameter dtype of trainers and engines.
        train_shape: The trainers' and the engine's model (a :data:`SHAPES` name or ``tiny``).
        sync_shape: The weight sync's model.
        async_shape: The model of the ``async_generation_ratio`` runs.
        samples: Rows of a training step (the rollout batch, one optimizer step).
        seq_len: Tokens per row (no padding: every token is real).
        micro_batch_size: Rows per forward pass of the TP=1 and torch steps.
        gen_prompt_len, gen_new_tokens: Prompt and generated tokens per generation request.
        gen_batch: Requests generated together (the rollout batch).
        peak_size: ``n`` of the ``n × n × n`` matmul that measures the peak.
        bucket_mb: Weight-sync bucket size.
        max_reps: Measured repetitions per item at most (the budget usually stops sooner).
        async_steps: Recipe steps per ``async_generation_ratio`` run.
        async_groups, async_group_size, async_turns, async_new_tokens: The async runs' batch.
        env_seconds, env_sigma: The long-tailed env: each step sleeps ``env_seconds ×
            factor``, ``factor`` log-normal (σ ``env_sigma``) drawn per episode.
    """

    device: str
    dtype: str
    train_shape: str
    sync_shape: str
    async_shape: str
    samples: int
    seq_len: int
    micro_batch_size: int
    gen_prompt_len: int
    gen_new_tokens: int
    gen_batch: int
    peak_size: int
    bucket_mb: int
    max_reps: int
    async_steps: int
    async_groups: int
    async_group_size: int
    async_turns: int
    async_new_tokens: int
    env_seconds: float
    env_sigma: float

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the JSON."""
        return asdict(self)


GPU = Settings(
    device="cuda",
    dtype="bfloat16",
    train_shape="Qwen2.5-1.5B",
    sync_shape="Qwen2.5-0.5B",
    async_shape="Qwen2.5-0.5B",
    samples=64,
    seq_len=1024,
    micro_batch_size=4,
    gen_prompt_len=256,
    gen_new_tokens=256,
    gen_batch=64,
    peak_size=8192,
    bucket_mb=256,
    max_reps=20,
    async_steps=4,
    async_groups=8,
    async_group_size=4,
    async_turns=3,
    async_new_tokens=32,
    env_seconds=0.3,
    env_sigma=1.0,
)
"""A lent H100/H200: 64 rows × 1024 tokens a step (the rollout batch of 8 prompts × 8)."""

DRY = Settings(
    device="cpu",
    dtype="float32",
    train_shape=TINY,
    sync_shape=TINY,
    async_shape=TINY,
    samples=4,
    seq_len=32,
    micro_batch_size=2,
    gen_prompt_len=16,
    gen_new_tokens=8,
    gen_batch=8,
    peak_size=256,
    bucket_mb=1,
    max_reps=1,
    async_steps=2,
    async_groups=2,
    async_group_size=2,
    async_turns=2,
    async_new_tokens=4,
    env_seconds=0.01,
    env_sigma=1.0,
)
"""The CPU dry run: every item end to end in a few seconds."""


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """A Qwen2 ``config.json`` of ``shape`` (Qwen2.5's rope theta and norm epsilon)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "tie_word_embeddings": shape.tied,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
    }


def build_tiny(path: Path) -> Path:
    """The tests' tiny model (random weights) with its tokenizer, once per ``path``."""
    if (path / "config.json").is_file():
        return path
    from agentgym.models.tiny import TinyModelSpec, build_tiny_model, env_corpus

    return build_tiny_model(env_corpus(), TinyModelSpec(), path)


def build_shaped(path: Path, shape: ModelShape, tokenizer_from: Path, device: str) -> Path:
    """A model of ``shape`` with random weights (N(0, 0.02), saved in bf16), once per ``path``.

    The weights are drawn on ``device`` (the 1.5B shape takes seconds on a GPU, a minute
    on a CPU).
    """
    if (path / "config.json").is_file():
        return path
    from transformers import Qwen2Config, Qwen2ForCausalLM

    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, partial / name)
    config = Qwen2Config(**hf_config(shape))
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device=device).bfloat16()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
    model.tie_weights()
    model.save_pretrained(partial)  # rotary buffers are not saved: loading recomputes them
    partial.rename(path)
    return path


def model_folder(name: str, root: Path, device: str) -> Path:
    """The folder of shape ``name`` under ``root`` (built on first use)."""
    tiny = build_tiny(root / TINY)
    if name == TINY:
        return tiny
    return build_shaped(root / name, SHAPES[name], tiny, device)


def shape_of(name: str, root: Path, device: str) -> ModelShape:
    """The :class:`ModelShape` of ``name`` (the tiny one read from its folder)."""
    if name in SHAPES:
        return SHAPES[name]
    return load_shape(str(model_folder(name, root, device)))
