"""The multi-turn loop: token-exact trajectories, groups, failures, limits, modes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.trajectory import RolloutBatch, Trajectory
from tests.conftest import masked_spans
from tests.rollout.envs import AddToolEnv, CountEnv, registered


def run(
    manager: EnvManager, backend: Any, tokenizer: Any, **config: Any
) -> tuple[RolloutResult, list[int]]:
    order: list[int] = []
    config.setdefault("prefix_check", "strict")
    config.setdefault("mode", "trajectory")
    config.setdefault("sequence_length", 4096)
    config.setdefault("history_length", 2)
    config.setdefault("sampling", SamplingParams(max_new_tokens=12, seed=0))
    result = asyncio.run(
        collect(
            manager,
            backend,
            ChatTokenizer(tokenizer),
            RolloutConfig(**config),
            on_trajectory=lambda t: order.append(t.group_id),
        )
    )
    return result, order


def assert_token_exact(trajectory: Trajectory, tokenizer: Any) -> None:
    """Decoding the loss-masked tokens gives exactly the model's responses."""
    ids, mask = trajectory.input_ids, trajectory.loss_mask
    assert len(ids) == len(mask)
    spans = masked_spans(ids, mask)
    assert spans == [turn.response_ids for turn in trajectory.turns]
    generated = [tokenizer.decode(span) for span in spans]
    assert generated == [tokenizer.decode(turn.response_ids) for turn in trajectory.turns]
    assert sum(mask) == sum(len(turn.response_ids) for turn in trajectory.turns)
    assert trajectory.prefix_drift is None


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.mark.parametrize("template", ["chatml", "qwen"])
def test_tiny_model_trajectories_are_token_exact(
    template: str, tiny_model_dir: Path, qwen_model_dir: Path
) -> None:
    path = tiny_model_dir if template == "chatml" else qwen_model_dir
    tokenizer = AutoTokenizer.from_pretrained(path)
    backend = HFBackend(
        AutoModelForCausalLM.from_pretrained(path).eval(), pad_token_id=tokenizer.pad_token_id
    )
    with registered("add_tool_test", AddToolEnv):
        manager = EnvManager(tags=["sokoban", "add_tool_test"], env_groups=2, group_size=2)
        result, _ = run(manager, backend, tokenizer, max_turns=3)
    assert len(result.trajectories) == 4
    for trajectory in result.trajectories:
        assert len(trajectory.turns) == 3  # a random model never finishes the episode
        assert_token_exact(trajectory, tokenizer)
    tool_trajectories = [t for t in result.trajectories if t.tag == "add_tool_test"]
    assert all(t.tools == AddToolEnv().tools for t in tool_trajectories)


def test_scripted_tool_episode_sends_results_as_tool_messages(qwen_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model_dir)
    with registered("add_tool_test", AddToolEnv):
        manager = EnvManager(tags=["add_tool_test"], env_groups=3, group_size=1)
        sampling = SamplingParams(max_new_tokens=64)
        result, _ = run(manager, ScriptedBackend(tokenizer), tokenizer, sampling=sampling)
    for trajectory in result.trajectories:
        assert trajectory.success
        assert trajectory.termination_reason == "terminated"
        assert [m["role"] for m in trajectory.messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert_token_exact(trajectory, tokenizer)
        assert trajectory.retokenized is False
        text = tokenizer.decode(trajectory.input_ids)
        assert "<tool_response>\n" + trajectory.messages[3]["content"] in text


def test_scripted_solver_solves_sokoban_through_the_token_path(tiny_tokenizer: Any) -> None:
    manager = EnvManager(tags=["sokoban", "frozen_lake"], env_groups=4, group_size=2, seed=3)
    result, _ = run(manager, ScriptedBackend(tiny_tokenizer), tiny_tokenizer, max_turns=40)
    assert result.metrics["all/success"] == 1.0
    assert result.metrics["all/invalid_action_rate"] == 0.0
    for trajectory in result.trajectories:
        assert_token_exact(trajectory, tiny_tokenizer)
        assert trajectory.score == pytest.approx(sum(turn.reward for turn in trajectory.turns))


def test_groups_share_a_start_and_differ_from_each_other(tiny_tokenizer: Any) -> None:
    manager = EnvManager(tags=["sokoban"], env_groups=4, group_size=3, seed=0)
    result, _ = run(manager, ScriptedBackend(tiny_tokenizer, "random"), tiny_tokenizer, max_turns=1)
    starts: dict[int, set[str]] = {}
    for trajectory in result.trajectories:
        starts.setdefault(trajectory.group_id, set()).add(trajectory.messages[1]["content"])
    assert len(starts) == 4
    assert all(len(observations) == 1 for observations in starts.values())
    assert len({next(iter(s)) for s in starts.values()}) == 4
    assert len({t.seed for t in result.trajectories}) == 4


def test_seeds_advance_and_resume_from_the_cursor(tiny_tokenizer: Any) -> None:
    def seeds(manager: EnvManager) -> list[int]:
        return [episodes[0].seed for episodes in manager.assignments()]

    first = EnvManager(tags=["sokoban"], env_groups=2, group_size=2, seed=7)
    batch_1, batch_2 = seeds(first), seeds(first)
    assert batch_1 != batch_2
    resumed = EnvManager(tags=["sokoban"], env_groups=2, group_size=2, seed=7)
    resumed.load_state_dict({"cursor": 2})
    assert seeds(resumed) == batch_2
    validation = EnvManager(tags=["sokoban"], env_groups=2, group_size=1, seed=7, fixed_seeds=True)
    assert seeds(validation) == seeds(validation)


def test_a_slow_env_does_not_hold_back_the_others(tiny_tokenizer: Any) -> None:
    with registered("slow_count", lambda **kw: CountEnv(delay=0.3, **kw)):
        manager = EnvManager(
            tags=["slow_count", "frozen_lake"], n_groups=[1, 3], env_groups=4, group_size=1
        )
        result, order = run(manager, ScriptedBackend(tiny_tokenizer), tiny_tokenizer)
    slow = next(t.group_id for t in result.trajectories if t.tag == "slow_count")
    assert order[-1] == slow
    assert all(t.success for t in result.trajectories)


def test_a_crashing_env_fails_only_its_trajectory(tiny_tokenizer: Any) -> None:
    with registered("crash_count", lambda **kw: CountEnv(crash_at=2, **kw)):
        manager = EnvManager(
            tags=["crash_count", "sokoban"], n_groups=[1, 2], env_groups=3, group_size=1
        )
        result, _ = run(manager, ScriptedBackend(tiny_tokenizer), tiny_tokenizer, max_turns=30)
    crashed = [t for t in result.trajectories if t.tag == "crash_count"]
    assert len(crashed) == 1
    assert crashed[0].env_name == "crash_count"
    assert crashed[0].termination_reason == "env_error"
    assert "the env crashed" in (crashed[0].error or "")
    assert len(crashed[0].turns) == 2  # the turn that crashed the env and the one before
    assert result.metrics["crash_count/failed"] == 1.0
    assert result.metrics["sokoban/success"] == 1.0
    batch = RolloutBatch.from_trajectories(
        result.trajectories, pad_token_id=tiny_tokenizer.pad_token_id
    )
    assert batch.tags == ["sokoban", "sokoban"]


def test_sequence_length_ends_the_episode_before_it_overflows(
    tiny_tokenizer: Any, hf_model: Any
) -> None:
    backend = HFBackend(hf_model, pad_token_id=tiny_tokenizer.pad_token_id)
    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=2)
    result, _ = run(manager, backend, tiny_tokenizer, max_turns=50, sequence_length=400)
    for trajectory in result.trajectories:
        assert trajectory.termination_reason == "max_length"
        assert len(trajectory.input_ids) + 12 <= 400
        assert_token_exact(trajectory, tiny_tokenizer)


def test_step_mode_keeps_a_window_of_exact_past_responses(
    tiny_tokenizer: Any, hf_model: Any
) -> None:
    backend = HFBackend(hf_model, pad_token_id=tiny_tokenizer.pad_token_id)
    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=1)
    result, _ = run(manager, backend, tiny_tokenizer, mode="step", max_turns=4, history_length=1)
    (trajectory,) = result.trajectories
    samples = trajectory.samples()
    assert len(samples) == 4
    chat = ChatTokenizer(tiny_tokenizer)
    for index, (turn, sample) in enumerate(zip(trajectory.turns, samples, strict=True)):
        assert sample.input_ids == turn.prompt_ids + turn.response_ids
        assert sum(sample.loss_mask) == len(turn.response_ids)
        if index:  # the previous response's ids appear verbatim in the prompt
            previous = trajectory.turns[index - 1].response_ids
            text = chat.tokenizer.decode(turn.prompt_ids)
            assert text.count("<|im_start|>assistant") == 2
            assert any(
                turn.prompt_ids[i : i + len(previous)] == previous
                for i in range(len(turn.prompt_ids))
            )
        else:
            assert chat.tokenizer.decode(turn.prompt_ids).count("<|im_start|>assistant") == 1


@pytest.mark.parametrize("strip", [True, False])
def test_step_mode_strips_think_blocks_of_past_turns(tiny_tokenizer: Any, strip: bool) -> None:
    with registered("count_think", lambda **kw: CountEnv(response_format="think_answer", **kw)):
        manager = EnvManager(tags=["count_think"], env_groups=1, group_size=1, seed=1)
        result, _ = run(
            manager,
            ScriptedBackend(tiny_tokenizer),
            tiny_tokenizer,
            mode="step",
            history_length=2,
            strip_think_history=strip,
            sampling=SamplingParams(max_new_tokens=32),
        )
    turns = result.trajectories[0].turns
    assert len(turns) >= 2
    assert all("<think>solver plan</think>" in turn.response_text for turn in turns)
    past = tiny_tokenizer.decode(turns[-1].prompt_ids)
    assert past.count("<answer>Inc</answer>") == 1 + min(2, len(turns) - 1)  # + the example
    assert ("solver plan" in past) is not strip


def test_rollout_batch_pads_and_aligns(tiny_tokenizer: Any, hf_model: Any) -> None:
    backend = HFBackend(hf_model, pad_token_id=tiny_tokenizer.pad_token_id)
    manager = EnvManager(tags=["sokoban"], env_groups=2, group_size=2)
    result, _ = run(manager, backend, tiny_tokenizer, max_turns=2)
    batch = RolloutBatch.from_trajectories(
        result.trajectories, pad_token_id=tiny_tokenizer.pad_token_id
    )
    lengths = [len(t.input_ids) for t in result.trajectories]
    assert batch.input_ids.shape == (4, max(lengths))
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert torch.equal(batch.loss_mask * batch.attention_mask, batch.loss_mask)
    assert (batch.engine_logprobs[batch.loss_mask == 0] == 0).all()
    assert (batch.engine_logprobs[batch.loss_mask == 1] < 0).all()
    assert batch.group_ids.tolist() == [t.group_id for t in result.trajectories]
    assert batch.scores.tolist() == pytest.approx([t.score for t in result.trajectories])


def test_train_and_val_managers_are_built_from_a_roll_style_config() -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    config = OmegaConf.create(
        """
        seed: 42
        custom_envs:
          SmallSokoban: {name: sokoban, kwargs: {dim_room: [6, 6], max_steps: 10}}
          Lake: {name: frozen_lake, kwargs: {size: 4}}
        train_env_manager:
          _target_: agentgym.rollout.env_manager.EnvManager
          tags: [SmallSokoban, Lake]
          n_groups: [3, 1]
          env_groups: 4
          group_size: 8
          format_penalty: -0.05
          env_configs: ${custom_envs}
          seed: ${seed}
        val_env_manager:
          _target_: agentgym.rollout.env_manager.EnvManager
          tags: [SmallSokoban, Lake]
          env_groups: 16
          group_size: 1
          env_configs: ${custom_envs}
          seed: ${seed}
          fixed_seeds: true
        """
    )
    train = instantiate(config.train_env_manager, _convert_="all")
    val = instantiate(config.val_env_manager, _convert_="all")
    assert len(train.slots) == 32
    assert train.group_tags == ["SmallSokoban"] * 3 + ["Lake"]
    assert train.slots[0].env.format_penalty == -0.05
    assert train.slots[0].env.max_steps == 10
    assert train.slots[-1].name == "frozen_lake"
    assert val.group_tags == ["SmallSokoban"] * 8 + ["Lake"] * 8
    with pytest.raises(ValueError, match="n_groups"):
        EnvManager(tags=["sokoban", "frozen_lake"], n_groups=[3], env_groups=4, group_size=1)
