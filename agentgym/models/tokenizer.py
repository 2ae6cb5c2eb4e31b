"""The tiny models' tokenizer: a byte-level BPE trained on the envs' own text.

Three choices keep the tiny model's prompts short and its grid legible:

* every grid cell, newline and answer tag is its own token (BPE never learns
  a merge across them), so a 6×6 Sokoban room is 41 tokens and an answer is
  ``<answer>``, the action, ``</answer>``, ``<|im_end|>``;
* the envs' instruction lines, repeated verbatim in every system prompt, can be
  kept whole as single tokens (``phrases``), so a Sokoban step prompt is about
  65 tokens instead of about 180;
* the saved tokenizer splits words as Qwen2's does, because transformers loads
  the tokenizer of any ``qwen2`` model folder as ``Qwen2Tokenizer``, which
  imposes that split: what the warm start, the trainer and vLLM tokenize is the
  same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentgym.envs.adapter import make_text_env
from agentgym.models.templates import TEMPLATES

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens: padding, and the ChatML turn delimiters (``<|im_end|>`` is the EOS)."""

MARKUP_TOKENS = (
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Response markup kept as single, ordinary (not special) tokens, as Qwen2.5 does."""

GRID_SYMBOLS = "#_OX√PSG"
"""Cell symbols of the grid envs' observations (Sokoban's and FrozenLake's ``SYMBOLS``)."""

QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's word split (transformers' ``Qwen2Tokenizer``), which loading imposes."""

ISOLATED = rf"</?answer>|\n|[{GRID_SYMBOLS}](?=[{GRID_SYMBOLS}]*(?:\n|\z))"
"""What BPE training never merges with a neighbour: the answer tags, newlines and
every cell of a grid line (a line made only of grid symbols). As no merge
across them is learned, Qwen2's coarser split keeps them single tokens too."""

CHAT_ROLES = ("system", "user", "assistant")
"""Role names the chat templates write; in the corpus so that each is one token."""


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int, chat_template: str, phrases: Iterable[str] = ()
) -> Any:
    """Train a byte-level BPE tokenizer on ``corpus`` and wrap it for transformers.

    Training splits text as Qwen2 does and, in addition, at :data:`ISOLATED`;
    the saved tokenizer splits as Qwen2 does (:data:`QWEN2_PRETOKENIZE_REGEX`).

    Args:
        corpus: Training texts (observations, instructions, responses).
        vocab_size: The most BPE tokens; training stops earlier when no pair is
            left to merge.
        chat_template: A key of :data:`TEMPLATES`.
        phrases: Texts to keep whole as single tokens wherever they appear
            (added tokens), e.g. the envs' instruction lines.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with the chat template set,
        ``<|im_end|>`` as EOS and ``<|endoftext|>`` as padding.

    Raises:
        ValueError: If ``chat_template`` is unknown.
    """
    if chat_template not in TEMPLATES:
        raise ValueError(
            f"Unknown chat_template {chat_template!r}; valid options: {sorted(TEMPLATES)}"
        )
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    def pre_tokenizer(*patterns: str) -> Any:
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
        return pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()  # as Qwen2Tokenizer's
    tokenizer.pre_tokenizer = pre_tokenizer(ISOLATED, QWEN2_PRETOKENIZE_REGEX)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.pre_tokenizer = pre_tokenizer(QWEN2_PRETOKENIZE_REGEX)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(list(MARKUP_TOKENS))
    fast.add_tokens([AddedToken(p, normalized=False) for p in dict.fromkeys(phrases) if p])
    fast.chat_template = TEMPLATES[chat_template]
    return fast


def env_corpus(names: Iterable[str] = ("sokoban", "frozen_lake"), seeds: int = 16) -> list[str]:
    """Instructions, observations and well-formed answers of registered envs, and the
    chat roles, for BPE training.

    Envs with an expert that writes whole responses (``oracle_response()``: WebShop,
    the tool envs) are also played by it from each seed, so that the pages, tool
    calls and tool results of a whole episode are in the corpus, not only its first
    observation (the grid envs' later observations are like their first).
    """
    texts: list[str] = []
    for name in names:
        env = _text_env(name)
        for seed in range(seeds):
            observation, _ = env.reset(seed=seed)
            texts += [observation, env.instructions]
            texts += _expert_episode(env)
        texts += [f"<answer>{action}</answer>" for action in env.action_names]
        env.close()
    texts += list(CHAT_ROLES)
    return texts * 4


def _expert_episode(env: Any) -> list[str]:
    """The responses, observations and tool results of the env's expert playing on
    from the env's current state; empty for an env without ``oracle_response()``."""
    oracle = getattr(env, "oracle_response", None)
    if not callable(oracle):
        return []
    texts: list[str] = []
    done = False
    while not done:
        response = str(oracle())
        observation, _, terminated, truncated, info = env.step(response)
        texts += [response, observation, *map(str, info.get("tool_results") or [])]
        done = terminated or truncated
    return texts


def instruction_lines(names: Iterable[str] = ("sokoban", "frozen_lake")) -> list[str]:
    """The lines of the envs' instructions (with their default arguments), in order."""
    lines: list[str] = []
    for name in names:
        lines += _text_env(name).instructions.splitlines()
    return list(dict.fromkeys(line for line in lines if line.strip()))


def _text_env(name: str) -> Any:
    return make_text_env(name)
