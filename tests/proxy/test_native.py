"""agent.kind=native: the env's conversation is each step's prompt, one sample a step
(ROLL's AgentNativeStepEnvManager), recorded token for token."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentgym.proxy.native import NativePlayer
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvConfig, EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.trajectory import RolloutBatch
from tests.proxy.test_proxy import Replies

REPLIES = ["<answer>Up</answer>", "no idea", "<answer>Left</answer>"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def play(tokenizer: Any, backend: Any, env: str, **changes: Any) -> RolloutResult:
    config = RolloutConfig(
        **{
            "mode": "step",
            "max_turns": 3,
            "sequence_length": 4096,
            "sampling": SamplingParams(max_new_tokens=16, seed=0),
            "prefix_check": "off",
            **changes,
        }
    )
    kwargs = {"max_steps": 10, "search_depth": 3} if env == "sokoban_native" else {}
    manager = EnvManager(
        tags=[env], env_configs={env: EnvConfig(env, kwargs)}, env_groups=2, group_size=2, seed=3
    )
    try:
        return asyncio.run(
            collect(manager, backend, ChatTokenizer(tokenizer), config, players=NativePlayer)
        )
    finally:
        manager.close()


def test_each_step_is_one_sample_whose_prompt_is_the_envs_conversation(tokenizer: Any) -> None:
    backend = Replies(tokenizer, REPLIES)
    result = play(tokenizer, backend, "sokoban_native")
    assert result.metrics["all/failed"] == 0
    samples = []
    for trajectory in result.trajectories:
        assert [turn.response_text for turn in trajectory.turns] == REPLIES
        assert trajectory.termination_reason == "max_turns"
        conversation = trajectory.messages  # the env's messages of the last step + the reply
        for step, (turn, sample) in enumerate(
            zip(trajectory.turns, trajectory.samples(), strict=True)
        ):
            handed = conversation[: 2 + 2 * step]  # what the env handed at this step
            assert handed[-1]["role"] == "user" and turn.observation == handed[-1]["content"]
            # the prompt is the env's messages through the chat template, as ROLL renders
            # them (the earlier replies are the engine's ids, which tokenize canonically here)
            expected = tokenizer.apply_chat_template(
                handed, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            reply = [*tokenizer.encode(REPLIES[step], add_special_tokens=False)]
            reply.append(tokenizer.eos_token_id)
            assert sample.input_ids == [*expected, *reply]
            assert sample.loss_mask == [0] * len(expected) + [1] * len(reply)
            assert sample.logprobs == [0.0] * len(expected) + [-0.5] * len(reply)
            assert sample.token_rewards[-1] == turn.reward
            samples.append(sample)
        # the env's rewards: a step of -0.1, the format penalty on the reply that is no action
        assert [turn.action_is_valid for turn in trajectory.turns] == [True, False, True]
        assert trajectory.turns[1].reward == pytest.approx(-0.2)
        # recorded as the loop records a step: whether it moved, where the episode is
        assert trajectory.turns[1].action_is_effective is False
        assert all(turn.action_is_effective is not None for turn in trajectory.turns)
        assert trajectory.final_observation and trajectory.final_observation != turn.observation
    # the backend saw exactly the samples' prompts, one request a step
    prompts = sorted(tuple(p) for p in backend.prompts)
    assert prompts == sorted(tuple(s.input_ids[: s.loss_mask.index(1)]) for s in samples)
    batch = RolloutBatch.from_trajectories(
        result.trajectories, pad_token_id=0, step_score="return", step_gamma=1.0
    )
    assert len(batch) == 4 * 3


def test_a_prompt_past_sequence_length_ends_the_episode_as_max_length(tokenizer: Any) -> None:
    result = play(tokenizer, Replies(tokenizer, REPLIES), "sokoban_native", sequence_length=600)
    first = result.trajectories[0]
    assert first.termination_reason == "max_length"
    assert 1 <= len(first.turns) < 3


def test_an_env_that_hands_no_conversation_fails_its_episodes_naming_the_key(
    tokenizer: Any,
) -> None:
    result = play(tokenizer, Replies(tokenizer, REPLIES), "sokoban")
    assert result.metrics["all/failed"] == 4
    error = result.trajectories[0].error or ""
    assert "env 'sokoban' handed no conversation (info['messages']" in error
    assert "play this env with agent.kind=env" in error
