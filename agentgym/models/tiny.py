"""Build small chat models locally: a byte-level BPE tokenizer trained on the
envs' own text (:mod:`agentgym.models.tokenizer`), a chat template, and a
randomly initialised Qwen2 model, warm-started on expert demonstrations if asked
(:mod:`agentgym.models.warmstart`).

No hub is needed. The models satisfy vLLM-on-CPU's constraints (head_dim >= 32,
untied embeddings), so every backend can serve them. :mod:`agentgym.models.cache`
builds one on first use and caches it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.models.tokenizer import (
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    build_tokenizer,
    env_corpus,
)

if TYPE_CHECKING:
    from agentgym.models.warmstart import WarmStartSpec

__all__ = [
    "MARKUP_TOKENS",
    "SPECIAL_TOKENS",
    "TinyModelSpec",
    "build_model",
    "build_tiny_model",
    "build_tokenizer",
    "env_corpus",
    "save_tiny_model",
]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a locally built Qwen2 model.

    Attributes:
        vocab_size: The most BPE tokens (special and markup tokens included);
            training stops earlier when no pair of the corpus is left to merge.
        hidden_size: Model width; ``hidden_size / num_attention_heads`` must be >= 32.
        intermediate_size: MLP width.
        num_hidden_layers: Transformer blocks.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads (grouped-query attention).
        max_position_embeddings: Longest sequence the model supports.
        chat_template: A key of :data:`agentgym.models.templates.TEMPLATES`.
        phrase_tokens: Keep each line of the corpus envs' instructions whole as
            one token (:func:`ensure_tiny_model`), so prompts are short.
        seed: Seed of the weight initialisation.
    """

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    chat_template: str = "chatml"
    phrase_tokens: bool = False
    seed: int = 0


_QWEN2_SHAPE = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
"""The :class:`TinyModelSpec` fields that ``Qwen2Config`` takes under the same names."""


def build_model(tokenizer: Any, spec: TinyModelSpec) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` sized by ``spec`` for ``tokenizer``.

    Raises:
        ValueError: If the head dimension is below 32 (vLLM's CPU attention minimum).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    head_dim = spec.hidden_size // spec.num_attention_heads
    if head_dim < 32:
        raise ValueError(
            f"hidden_size / num_attention_heads = {head_dim}; it must be >= 32 "
            "for vLLM's CPU attention"
        )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{name: getattr(spec, name) for name in _QWEN2_SHAPE},
    )
    torch.manual_seed(spec.seed)
    return Qwen2ForCausalLM(config).eval()


def build_tiny_model(
    corpus: Iterable[str],
    spec: TinyModelSpec,
    path: str | Path,
    warm_start: WarmStartSpec | None = None,
    phrases: Iterable[str] = (),
) -> Path:
    """Build a tokenizer and a random model, warm-start it if asked, and save both to ``path``.

    The folder is a regular Hugging Face model folder: transformers, vLLM and
    ``vllm serve`` load it directly.

    Args:
        corpus: BPE training texts.
        spec: The model's shape.
        path: Where to save.
        warm_start: Supervised warm start on expert demonstrations
            (:mod:`agentgym.models.warmstart`); None: random weights.
        phrases: Texts the tokenizer keeps whole as single tokens.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    tokenizer = build_tokenizer(corpus, spec.vocab_size, spec.chat_template, phrases)
    return save_tiny_model(tokenizer, spec, path, warm_start)


def save_tiny_model(
    tokenizer: Any, spec: TinyModelSpec, path: str | Path, warm_start: WarmStartSpec | None = None
) -> Path:
    """A random model sized by ``spec`` for ``tokenizer``, warm-started if asked, saved with
    the tokenizer to ``path``; ``path``."""
    path = Path(path)
    model = build_model(tokenizer, spec)
    if warm_start is not None and warm_start.steps:
        from transformers import AutoTokenizer

        # the warm start imports the envs, whose registration imports this module
        from agentgym.models.warmstart import build_examples
        from agentgym.models.warmstart import warm_start as train_warm_start

        started = time.perf_counter()
        # demonstrations are tokenized by the tokenizer as every user of the folder loads it
        tokenizer.save_pretrained(path)
        model.config.save_pretrained(path)
        examples = build_examples(AutoTokenizer.from_pretrained(str(path)), warm_start)
        losses = train_warm_start(model, examples, warm_start)
        tail = losses[-10:]
        print(
            f"warm start: {warm_start.steps} steps on {len(examples)} expert demonstrations "
            f"({', '.join(sorted(warm_start.envs))}): answer loss {losses[0]:.3f} -> "
            f"{sum(tail) / len(tail):.3f} in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
