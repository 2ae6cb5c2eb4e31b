"""Model shapes the planner reads: a Hugging Face folder or ``config.json``, or a named shape."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the memory and time formulas need of a dense decoder (Qwen2, Llama, Qwen3).

    Attributes:
        name: A label for the table.
        vocab_size: Rows of the embedding (before any padding).
        hidden_size: ``h``.
        intermediate_size: ``f``, the SwiGLU width (gate and up are ``h × f`` each).
        num_layers: ``L``.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (query groups).
        head_dim: Channels per head.
        tied: Whether the output layer reuses the embedding.
        qkv_bias: Whether q, k, v carry a bias (Qwen2).
        qk_norm: Whether q and k carry an RMSNorm over ``head_dim`` (Qwen3).
    """

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool = True
    qk_norm: bool = False

    @property
    def q_size(self) -> int:
        """Query projection width, ``heads × head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Key (or value) projection width, ``kv_heads × head_dim``."""
        return self.num_kv_heads * self.head_dim


# The published config.json of each model (huggingface.co/Qwen/<name>/blob/main/config.json).
SHAPES: dict[str, ModelShape] = {
    "Qwen2.5-0.5B": ModelShape("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, 64, tied=True),
    "Qwen2.5-1.5B": ModelShape("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, 128, tied=True),
    "Qwen2.5-7B": ModelShape("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, 128, tied=False),
}
"""Named shapes ``agentgym plan --model`` accepts besides a folder or a config file."""


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json``'s fields."""
    heads = int(config["num_attention_heads"])
    model_type = config.get("model_type", "qwen2")
    return ModelShape(
        name=name,
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def load_shape(model: str) -> ModelShape:
    """The shape of ``model``: a name in :data:`SHAPES`, a model folder or a ``config.json``.

    Raises:
        ValueError: If ``model`` is none of these (with the close names).
    """
    if model in SHAPES:
        return SHAPES[model]
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_config(json.loads(path.read_text()), Path(model).name)
    close = difflib.get_close_matches(model, SHAPES, n=3)
    hint = f"; did you mean {close}?" if close else ""
    raise ValueError(
        f"model {model!r} is neither a named shape {list(SHAPES)}, a model folder nor a "
        f"config.json{hint}"
    )
