"""The tiny tokenizer: one token per grid cell, 4-token answers, short prompts,
and the same tokens however transformers loads the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import agentgym
from agentgym.envs.frozen_lake import SYMBOLS as LAKE_SYMBOLS
from agentgym.envs.sokoban import SYMBOLS as SOKOBAN_SYMBOLS
from agentgym.models.tiny import TinyModelSpec, build_tiny_model
from agentgym.models.tokenizer import GRID_SYMBOLS, env_corpus, instruction_lines
from agentgym.models.warmstart import prompt_ids

ENVS: dict[str, dict[str, Any]] = {
    "sokoban": {"dim_room": [6, 6], "search_depth": 3},
    "frozen_lake": {"size": 4},
}


def make(name: str) -> Any:
    """The unwrapped env (a TextEnv) with the test's arguments."""
    return agentgym.make(name, **ENVS[name]).unwrapped


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(phrase_tokens=True)
    path = tmp_path_factory.mktemp("tiny-phrases")
    return build_tiny_model(env_corpus(), spec, path, phrases=instruction_lines())


@pytest.fixture(scope="module")
def tokenizer(folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(folder)


def observations(name: str, count: int = 20) -> list[str]:
    env = make(name)
    return [env.reset(seed=seed)[0] for seed in range(count)]


def test_grid_symbols_cover_the_grid_envs() -> None:
    assert set(SOKOBAN_SYMBOLS.values()) | set(LAKE_SYMBOLS.values()) == set(GRID_SYMBOLS)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_every_cell_and_newline_is_one_token(tokenizer: Any, name: str) -> None:
    for observation in observations(name):
        tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode(observation))
        assert len(tokens) == len(observation)  # one token per character: cell or newline
        assert tokenizer.decode(tokenizer.encode(observation)) == observation


@pytest.mark.parametrize("action", ["Up", "Down", "Left", "Right"])
def test_an_answer_is_four_tokens(tokenizer: Any, action: str) -> None:
    ids = tokenizer.encode(f"<answer>{action}</answer><|im_end|>")
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens == ["<answer>", action, "</answer>", "<|im_end|>"]


def test_step_prompts_are_short(tokenizer: Any) -> None:
    for name, length in [("sokoban", 63), ("frozen_lake", 41)]:
        env = make(name)
        observation, _ = env.reset(seed=0)
        # scaffolding 13, one token per instruction line and per newline between, the grid
        assert len(prompt_ids(tokenizer, env.instructions, observation)) == length


def test_qwen2_loading_and_the_saved_tokenizer_agree(folder: Path, tokenizer: Any) -> None:
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"  # transformers' choice for qwen2
    plain = PreTrainedTokenizerFast.from_pretrained(folder)  # the tokenizer.json as saved
    env = make("sokoban")
    texts = [*observations("sokoban"), *observations("frozen_lake"), env.instructions]
    texts += ["Symbols: P you standing next to a box.\n######\n#PX_O#", "<answer>Up</answer>"]
    for text in texts:
        assert tokenizer.encode(text) == plain.encode(text)
