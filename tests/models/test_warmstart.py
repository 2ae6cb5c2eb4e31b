"""The supervised warm start: expert labels, answer-only loss, and a short run
that lowers the loss and makes answers parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentgym
from agentgym.envs.parsing import parse_response
from agentgym.models.tiny import TinyModelSpec, build_tiny_model, ensure_tiny_model
from agentgym.models.tokenizer import env_corpus, instruction_lines
from agentgym.models.warmstart import (
    IGNORE_INDEX,
    Example,
    WarmStartSpec,
    build_examples,
    collate,
    expert_pairs,
    greedy_answers,
    warm_start,
)

SOKOBAN = {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10, "search_depth": 3}
LAKE = {"size": 4, "max_steps": 10}
ACTIONS = ("Up", "Down", "Left", "Right")


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    path = build_tiny_model(
        env_corpus(),
        TinyModelSpec(phrase_tokens=True),
        tmp_path_factory.mktemp("tiny-random"),
        phrases=instruction_lines(),
    )
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_expert_labels_are_the_solvers_first_moves() -> None:
    pairs = expert_pairs("sokoban", SOKOBAN, 40, explore=0.5, seed=3)
    assert len(pairs) == 40
    env: Any = agentgym.make("sokoban", **SOKOBAN).unwrapped
    for instructions, observation, action, response_format in pairs:
        assert instructions == env.instructions and response_format == "answer"
        assert action in ACTIONS and observation.count("\n") == 5
    # without exploration, an episode's labels are one optimal plan, state by state
    first = expert_pairs("sokoban", SOKOBAN, 3, explore=0.0, seed=7)
    env.reset(seed=7)
    assert [action for _, _, action, _ in first] == env.solve()[:3]


def test_label_noise_replaces_labels_but_not_the_states_visited() -> None:
    clean = expert_pairs("frozen_lake", LAKE, 400, explore=0.25, seed=5)
    noisy = expert_pairs("frozen_lake", LAKE, 400, explore=0.25, seed=5, label_noise=0.5)
    # the same episodes are played: the moves do not depend on the labels
    assert [p[1] for p in noisy] == [p[1] for p in clean]
    changed = sum(c[2] != n[2] for c, n in zip(clean, noisy, strict=True))
    # half the labels are drawn uniformly, and 3 in 4 of those differ from the solver's
    assert 0.25 < changed / 400 < 0.5
    assert {n[2] for n in noisy} == set(ACTIONS)
    with pytest.raises(ValueError, match="label_noise must be in"):
        WarmStartSpec(label_noise=1.5)


def test_collate_puts_the_loss_on_answer_tokens_only() -> None:
    examples = [
        Example("e", prompt_ids=[5, 6, 7], answer_ids=[8, 9], action="Up"),
        Example("e", prompt_ids=[5], answer_ids=[8, 9, 10], action="Up"),
    ]
    batch = collate(examples, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 10, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    ignore = IGNORE_INDEX
    assert batch["labels"].tolist() == [
        [ignore, ignore, ignore, 8, 9],
        [ignore, 8, 9, 10, ignore],
    ]


def parse_rate(model: Any, tokenizer: Any, examples: list[Example]) -> float:
    answers = greedy_answers(model, tokenizer, examples)
    return sum(parse_response(a, ACTIONS).is_valid for a in answers) / len(answers)


def test_a_short_warm_start_lowers_the_loss_and_teaches_the_format(
    random_model: tuple[Any, Any],
) -> None:
    model, tokenizer = random_model
    spec = WarmStartSpec(
        steps=40,
        batch_size=32,
        examples_per_env=256,
        envs={"sokoban": SOKOBAN, "frozen_lake": LAKE},
    )
    examples = build_examples(tokenizer, spec)
    assert {e.env_name for e in examples} == {"sokoban", "frozen_lake"}
    assert len(examples) == 512
    held_out = build_examples(tokenizer, WarmStartSpec(examples_per_env=16, envs=spec.envs, seed=9))
    before = parse_rate(model, tokenizer, held_out)
    losses = warm_start(model, examples, spec)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    after = parse_rate(model, tokenizer, held_out)
    assert before < 0.2 and after > 0.8, (before, after)


def test_the_cache_key_includes_the_warm_start(tmp_path: Path) -> None:
    spec = TinyModelSpec()
    short = WarmStartSpec(steps=1, batch_size=2, examples_per_env=4, envs={"frozen_lake": LAKE})
    first = ensure_tiny_model(spec, tmp_path, warm_start=short)
    assert ensure_tiny_model(spec, tmp_path, warm_start=short) == first  # cached
    other = WarmStartSpec(steps=2, batch_size=2, examples_per_env=4, envs={"frozen_lake": LAKE})
    second = ensure_tiny_model(spec, tmp_path, warm_start=other)
    random = ensure_tiny_model(spec, tmp_path)
    assert len({first, second, random}) == 3
    weights = [AutoModelForCausalLM.from_pretrained(p).lm_head.weight for p in (first, random)]
    assert not torch.equal(*weights)  # the warm-started folder holds trained weights


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": -1}, "steps must be positive"),
        ({"explore": 1.0}, "explore must be in [0, 1)"),
        ({"envs": {}}, "at least one env"),
    ],
)
def test_bad_warm_start_settings_fail_clearly(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        WarmStartSpec(**kwargs)


def test_an_env_without_a_solver_is_refused() -> None:
    with pytest.raises(TypeError, match="no solve"):
        expert_pairs("math_tool", {}, 1, explore=0.0, seed=0)
