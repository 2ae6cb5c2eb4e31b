"""Tiny local models (random Qwen2 weights, BPE trained on env text) for rollout tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.envs.text_env import TextEnv
from agentgym.models.tiny import TinyModelSpec, build_tiny_model


def env_corpus() -> list[str]:
    """Observations, instructions and well-formed answers of the built-in envs."""
    texts = []
    for name in ("sokoban", "frozen_lake"):
        env = agentgym.make(name).unwrapped
        assert isinstance(env, TextEnv)
        for seed in range(8):
            observation, _ = env.reset(seed=seed)
            texts += [observation, env.instructions]
        texts += [f"<answer>{action}</answer>" for action in env.action_names]
    texts += ['<tool_call>{"name": "python", "arguments": {"code": "print(1 + 2)"}}</tool_call>']
    return texts * 4


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ChatML tiny model folder."""
    return build_tiny_model(env_corpus(), TinyModelSpec(), tmp_path_factory.mktemp("tiny-chatml"))


@pytest.fixture(scope="session")
def qwen_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder with the Qwen2.5-style tools template."""
    spec = TinyModelSpec(chat_template="qwen2.5", seed=1)
    return build_tiny_model(env_corpus(), spec, tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive ids where ``mask`` is 1: one per model response.

    Responses are decoded one span at a time: a random model may end a
    response inside a multi-byte character, which must not merge with the
    next response's bytes.
    """
    spans: list[list[int]] = []
    previous = 0
    for token, flag in zip(ids, mask, strict=True):
        if flag and not previous:
            spans.append([])
        if flag:
            spans[-1].append(token)
        previous = flag
    return spans
