"""The supervised warm start: expert labels, answer-only loss, and a short run
that lowers the loss and makes answers parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentgym
from agentgym.envs.parsing import parse_response
from agentgym.models.cache import ensure_tiny_model
from agentgym.models.tiny import TinyModelSpec, build_tiny_model
from agentgym.models.tokenizer import env_corpus, instruction_lines
from agentgym.models.warmstart import (
    IGNORE_INDEX,
    Example,
    WarmStartSpec,
    action_choice,
    answer_loss,
    build_examples,
    collate,
    demonstrations,
    greedy_answers,
    warm_start,
)
from tests.rollout.envs import CountEnv, registered

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
    found = demonstrations("sokoban", SOKOBAN, 40, explore=0.5, seed=3)
    assert len(found) == 40
    env: Any = agentgym.make("sokoban", **SOKOBAN).unwrapped
    for demonstration in found:
        system, observation = demonstration.messages  # no history: system and observation
        assert system == {"role": "system", "content": env.instructions}
        assert observation["role"] == "user" and observation["content"].count("\n") == 5
        assert demonstration.action in ACTIONS
        assert demonstration.response == f"<answer>{demonstration.action}</answer>"
    # without exploration, an episode's labels are one optimal plan, state by state
    first = demonstrations("sokoban", SOKOBAN, 3, explore=0.0, seed=7)
    env.reset(seed=7)
    assert [d.action for d in first] == env.solve()[:3]


def test_label_noise_replaces_labels_but_not_the_states_visited() -> None:
    clean = demonstrations("frozen_lake", LAKE, 400, explore=0.25, seed=5)
    noisy = demonstrations("frozen_lake", LAKE, 400, explore=0.25, seed=5, label_noise=0.5)
    # the same episodes are played: the moves do not depend on the labels
    assert [d.messages for d in noisy] == [d.messages for d in clean]
    changed = sum(c.action != n.action for c, n in zip(clean, noisy, strict=True))
    # half the labels are drawn uniformly, and 3 in 4 of those differ from the solver's
    assert 0.25 < changed / 400 < 0.5
    assert {n.action for n in noisy} == set(ACTIONS)
    with pytest.raises(ValueError, match="label_noise must be in"):
        WarmStartSpec(label_noise=1.5)


def test_expected_noise_keeps_the_solvers_labels_and_marks_the_action_token(
    random_model: tuple[Any, Any],
) -> None:
    _, tokenizer = random_model
    envs = {"frozen_lake": LAKE}
    clean = WarmStartSpec(examples_per_env=64, envs=envs, label_noise=0.0)
    expected = WarmStartSpec(examples_per_env=64, envs=envs, label_noise=0.5)
    sampled = WarmStartSpec(
        examples_per_env=64, envs=envs, label_noise=0.5, label_noise_mode="sampled"
    )
    plain = build_examples(tokenizer, clean)
    assert [e.action for e in build_examples(tokenizer, expected)] == [e.action for e in plain]
    assert [e.action for e in build_examples(tokenizer, sampled)] != [e.action for e in plain]
    example = build_examples(tokenizer, expected)[0]
    assert example.choice_index is not None
    # the choices are the four actions' tokens, at the place the expert's action sits
    action_tokens = [tokenizer.convert_tokens_to_ids(a) for a in ACTIONS]
    assert set(example.choice_ids) == set(action_tokens)
    assert tokenizer.decode([example.answer_ids[example.choice_index]]) == example.action


def test_action_choice_needs_answers_that_differ_in_one_token() -> None:
    assert action_choice("e", [[1, 5, 2], [1, 6, 2], [1, 7, 2]]) == (1, (5, 6, 7))
    for answers in ([[1, 5, 2], [1, 6]], [[1, 5, 2], [3, 6, 2]], [[1, 5], [1, 5]]):
        with pytest.raises(ValueError, match="label_noise_mode=sampled"):
            action_choice("e", answers)
    with pytest.raises(ValueError, match="label_noise_mode must be one of"):
        WarmStartSpec(label_noise_mode="soft")


class FixedLogits(torch.nn.Module):
    """A "model" whose logits are given: [B, T, V]."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, **_: Any) -> Any:
        return type("Output", (), {"logits": self.logits})()


def test_the_expected_loss_is_the_noisy_demonstrators_mean_cross_entropy() -> None:
    # one row: prompt [9], answer [1, 2]; the action token (index 0 of the
    # answer, position 1 of the row) is predicted at position 0
    examples = [Example("e", [9], [1, 2], "A", choice_index=0, choice_ids=(1, 3))]
    batch = collate(examples, pad_token_id=0)
    assert batch["choice_positions"].tolist() == [1] and batch["choice_ids"].tolist() == [[1, 3]]
    logits = torch.zeros(1, 3, 4)
    logits[0, 0] = torch.tensor([0.0, 2.0, 0.0, 1.0])  # predicts the action token
    logits[0, 1] = torch.tensor([0.0, 0.0, 3.0, 0.0])  # predicts token 2
    model = FixedLogits(logits)
    logp0 = logits[0, 0].log_softmax(-1)
    logp1 = logits[0, 1].log_softmax(-1)
    clean = -(logp0[1] + logp1[2]) / 2
    torch.testing.assert_close(answer_loss(model, batch), clean)
    # ε = 0.5: the action token's CE is 0.5·CE(1) + 0.5·mean(CE(1), CE(3))
    action = 0.5 * -logp0[1] + 0.5 * -(logp0[1] + logp0[3]) / 2
    torch.testing.assert_close(answer_loss(model, batch, 0.5), (action - logp1[2]) / 2)
    # a row without choices (sampled mode) is unaffected by ε
    batch = collate([Example("e", [9], [1, 2], "A")], pad_token_id=0)
    torch.testing.assert_close(answer_loss(model, batch, 0.5), clean)


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


class Unsolved(CountEnv):
    """CountEnv without its solver."""

    solve = None  # type: ignore[assignment]


def test_an_env_without_an_expert_is_refused() -> None:
    with (
        registered("count_no_expert", Unsolved),
        pytest.raises(TypeError, match=r"has no solve\(\) and no oracle_response\(\)"),
    ):
        demonstrations("count_no_expert", {}, 1, explore=0.0, seed=0)


def test_oracle_envs_demonstrate_whole_responses_with_their_history() -> None:
    call, answer = demonstrations("math_tool", {}, 2, explore=0.5, seed=0, history_length=1)
    assert call.response.startswith('<tool_call>{"name": "python"')
    assert call.action == call.response  # no action vocabulary: the label is the response
    assert [m["role"] for m in call.messages] == ["system", "user"]
    # the answer turn keeps the question and the call, then the tool's result
    assert [m["role"] for m in answer.messages] == ["system", "user", "assistant", "tool"]
    assert answer.messages[1] == call.messages[1] and answer.messages[2]["content"] == call.response
    printed = answer.messages[3]["content"].strip()
    assert answer.response == f"<answer>{printed}</answer>"
    # without history the answer turn sees the result only
    _, alone = demonstrations("math_tool", {}, 2, explore=0.0, seed=0)
    assert [m["role"] for m in alone.messages] == ["system", "tool"]


@pytest.mark.parametrize(
    ("env", "history_length"),
    [("sokoban", 0), ("webshop", 0), ("sql", 1), ("search_qa", 2), ("math_tool", 1)],
)
def test_demonstration_prompts_are_the_rollouts_step_prompts(
    tiny_tokenizer: Any, env: str, history_length: int
) -> None:
    # the rollout, with the env's expert as the policy, shows the model exactly the
    # prompts the warm start trains on (token for token)
    import asyncio

    from agentgym.envs.adapter import make_text_env
    from agentgym.models.warmstart import render_prompt
    from agentgym.rollout.backends.base import SamplingParams
    from agentgym.rollout.backends.scripted import ScriptedBackend
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.env_manager import EnvManager
    from agentgym.rollout.loop import RolloutConfig, collect

    kwargs = SOKOBAN if env == "sokoban" else {}
    manager = EnvManager(
        tags=[env],
        env_groups=2,
        group_size=1,
        env_configs={env: {"name": env, "kwargs": kwargs}},
        seed=1,
    )
    config = RolloutConfig(
        mode="step", history_length=history_length, sequence_length=4096, max_turns=8,
        sampling=SamplingParams(max_new_tokens=512),
    )  # fmt: skip
    result = asyncio.run(
        collect(manager, ScriptedBackend(tiny_tokenizer), ChatTokenizer(tiny_tokenizer), config)
    )
    tools = make_text_env(env, kwargs).tools
    for trajectory in result.trajectories:
        assert trajectory.success and len(trajectory.turns) >= 2
        found = demonstrations(
            env, kwargs, len(trajectory.turns), explore=0.0, seed=trajectory.seed,
            history_length=history_length,
        )  # fmt: skip
        for turn, demonstration in zip(trajectory.turns, found, strict=True):
            assert render_prompt(tiny_tokenizer, demonstration.messages, tools) == turn.prompt_ids
            assert demonstration.response == turn.response_text


def test_the_default_recipe_keeps_its_cache_folder(tmp_path: Path) -> None:
    # history_length joined the warm start after models were cached: at its default it
    # stays out of the cache key, so the folders of the earlier recipe stay valid
    import hashlib
    import json
    from dataclasses import asdict

    from agentgym.models.cache import TINY_VERSION

    spec, recipe = TinyModelSpec(), WarmStartSpec(steps=0)
    earlier = {k: v for k, v in asdict(recipe).items() if k != "history_length"}
    key = {"spec": asdict(spec), "envs": ["sokoban", "frozen_lake"], "warm_start": earlier}
    digest = hashlib.sha256(
        json.dumps({**key, "version": TINY_VERSION}, sort_keys=True).encode()
    ).hexdigest()[:12]
    assert ensure_tiny_model(spec, tmp_path, warm_start=recipe).name == f"tiny-{digest}"
    longer = ensure_tiny_model(spec, tmp_path, warm_start=WarmStartSpec(steps=0, history_length=1))
    assert longer.name != f"tiny-{digest}"


def test_two_processes_wanting_one_model_build_it_once(tmp_path: Path) -> None:
    script = f"""
import sys
from agentgym.models.cache import ensure_tiny_model
from agentgym.models.tiny import TinyModelSpec
from agentgym.models.warmstart import WarmStartSpec
short = WarmStartSpec(steps=20, batch_size=2, examples_per_env=8, envs={{"frozen_lake": {LAKE!r}}})
print("model", ensure_tiny_model(TinyModelSpec(), sys.argv[1], warm_start=short))
"""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    firsts = sorted(output.split(" ", 1)[0] for output in outputs)
    assert firsts == ["building", "waiting"], outputs  # one builds, the other waits for it
    (built,) = {output.splitlines()[-1].removeprefix("model ") for output in outputs}
    assert [p.name for p in tmp_path.glob("tiny-*")] == [Path(built).name]
