"""math_workflow: Trinity's reward on hand-scored cases, Trinity's prompt through the chat
template, the seed → task mapping, the generator, and a 2-step training run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.envs.math_workflow import MathWorkflowEnv, generate_problems, math_reward
from agentgym.envs.math_workflow.reward import reference_answer
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.tasksets import TaskSetError
from tests.envs.trainrun import logged_steps, run_python

# Trinity-RFT's MathWorkflow system prompt (trinity/common/workflows/workflow.py), verbatim
TRINITY_SYSTEM_PROMPT = """A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e.,
<think> reasoning process here </think>
<answer> answer here </answer>.
"""  # noqa: E501


@pytest.mark.parametrize(
    ("response", "truth", "accuracy", "format_score"),
    [
        ("<think>x</think>\n<answer>72</answer>", "#### 72", 1.0, 0.1),
        ("The answer is 72.", "#### 72", 1.0, -0.1),
        ("<think>x</think>\n<answer>71</answer>", "#### 72", 0.0, 0.1),
        ("I do not know.", "#### 72", 0.0, -0.1),
        ("<think>x</think>\n<answer>1600</answer>", "#### 1,600", 1.0, 0.1),
        ("1600", "#### 1,600", 1.0, -0.1),  # right, out of format: 0.9
        ("<think>a</think><answer>$\\boxed{1,600}$</answer>", "#### 1600", 1.0, 0.1),
        # Trinity's answer regex has no DOTALL: a two-line answer is read from the whole text
        ("<answer>5\n</answer> The answer is 7", "#### 5", 0.0, -0.1),
        ("<answer>5</answer> The answer is 7", "#### 5", 1.0, -0.1),
        # Trinity's format regex is MULTILINE: text after the answer's line still matches
        ("<think>a</think><answer>5</answer>\nthanks", "#### 5", 1.0, 0.1),
        ("<think>a<answer>5</answer>", "#### 5", 1.0, -0.1),
        # a worked GSM8K solution: the number after ####, not the first one
        ("<answer>72</answer>", "48/2 = <<48/2=24>>24\n48+24 = <<48+24=72>>72\n#### 72", 1.0, -0.1),
    ],
)
def test_trinity_math_reward_by_hand(
    response: str, truth: str, accuracy: float, format_score: float
) -> None:
    score = math_reward(response, truth)
    assert (score.accuracy, score.format_score) == (accuracy, format_score)
    assert score.total == pytest.approx(accuracy + format_score)


def test_reference_answer() -> None:
    assert reference_answer("so 3*4 = 12.\n#### 1,600") == "1,600"
    assert reference_answer("#### 72\n") == "72"
    assert reference_answer("\\frac{1}{2}") == "\\frac{1}{2}"  # no ####: the whole text


def test_env_reward_terms_and_info() -> None:
    env = MathWorkflowEnv(taskset=None, num_problems=10)
    env.reset(seed=0, options={"task_index": 0})
    truth = env._task.response or ""
    final = reference_answer(truth).replace(",", "")
    _, reward, terminated, truncated, info = env.step(f"<think>x</think><answer>{final}</answer>")
    assert reward == pytest.approx(1.1)
    assert (terminated, truncated) == (True, False)
    assert info["success"] and info["action_is_valid"]
    assert (info["accuracy"], info["format_score"]) == (1.0, 0.1)
    env.reset(seed=0, options={"task_index": 0})
    _, reward, _, _, info = env.step(f"{int(final) + 1}<|im_end|>")
    assert reward == pytest.approx(-0.1)  # wrong and out of format: an invalid turn
    assert not info["action_is_valid"] and not info["success"]
    assert info["format_score"] == -0.1
    with pytest.raises(RuntimeError, match="finished episode"):  # one turn only
        env.step("<think>x</think><answer>1</answer>")


def test_seed_picks_task_seed_mod_len(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    taskset = {"path": str(path), "format": {"prompt_key": "question", "response_key": "answer"}}
    env = MathWorkflowEnv(taskset=taskset)
    assert [env.reset(seed=s)[0] for s in (0, 3, 5, 13)] == ["q0", "q3", "q0", "q3"]
    observation, info = env.reset(seed=1, options={"task_index": 7})
    assert (observation, info["task_index"], info["taskset"]) == ("q2", 7, "g")
    mixed = MathWorkflowEnv(
        taskset=[{**taskset, "name": "a", "weight": 2}, {**taskset, "name": "b"}]
    )
    assert [mixed.reset(seed=s)[1]["taskset"] for s in range(3)] == ["a", "b", "a"]
    with pytest.raises(TaskSetError, match="empty list"):
        MathWorkflowEnv(taskset=[])


def test_generated_problems_are_gsm8k_format_deterministic_and_solved_by_the_expert() -> None:
    first = generate_problems(50, seed=3)
    assert first == generate_problems(50, seed=3)
    assert first != generate_problems(50, seed=4)
    assert all(row["question"].isascii() and "\n#### " in row["answer"] for row in first)
    assert any("," in row["answer"].rpartition("####")[2] for row in generate_problems(300))
    env = MathWorkflowEnv(num_problems=50, problems_seed=3)
    for index in range(50):
        env.reset(options={"task_index": index})
        *_, info = env.step(env.oracle_response())
        assert info["success"] and info["format_score"] == 0.1


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 2**31 - 1))
def test_generated_answers_are_the_arithmetic(seed: int, index: int) -> None:
    (row,) = generate_problems(1, seed=seed)
    steps = row["answer"].split("\n")[:-1]
    for step in steps:  # every calculator note is right: <<a op b=c>>
        note = step.split("<<")[1].split(">>")[0]
        expression, result = note.split("=")
        assert eval(expression) == int(result)  # our own digits and one operator
    last = steps[-1].split("<<")[1].split("=")[1].split(">>")[0]
    assert row["answer"].endswith(f"#### {int(last):,}")


def test_prompt_is_trinity_system_prompt_and_question_through_the_chat_template(
    tiny_tokenizer: Any,
) -> None:
    manager = EnvManager(tags=["math_workflow"], env_groups=2, group_size=2, seed=5)
    config = RolloutConfig(
        mode="trajectory", max_turns=1, sequence_length=1024, history_length=0,
        sampling=SamplingParams(max_new_tokens=256, seed=0),
    )  # fmt: skip
    backend = ScriptedBackend(tiny_tokenizer, agent="solver")
    result = asyncio.run(collect(manager, backend, ChatTokenizer(tiny_tokenizer), config))
    assert len(result.trajectories) == 4
    for trajectory in result.trajectories:
        question = trajectory.messages[1]["content"]
        messages = [
            {"role": "system", "content": TRINITY_SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ]
        text = tiny_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        expected = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert trajectory.turns[0].prompt_ids == expected
        assert trajectory.score == pytest.approx(1.1)  # the expert: right and in format
    by_group: dict[int, set[str]] = {}
    for trajectory in result.trajectories:  # a group shares its task
        by_group.setdefault(trajectory.group_id, set()).add(trajectory.messages[1]["content"])
    assert all(len(questions) == 1 for questions in by_group.values())


def test_registered_with_its_config() -> None:
    assert agentgym.spec("math_workflow").id == "agentgym/MathWorkflow-v0"
    env = agentgym.make("math_workflow").unwrapped
    assert isinstance(env, MathWorkflowEnv)
    assert env.instructions == TRINITY_SYSTEM_PROMPT


def test_train_two_steps(tmp_path: Path) -> None:
    output = tmp_path / "run"
    args = ["-m", "agentgym.train", "env=math_workflow", "max_steps=2", "save_steps=2",
            "eval_steps=2", "train_env_manager.env_groups=2", "train_env_manager.group_size=2",
            "rollout_batch_size=4", "val_batch_size=2", "val_env_manager.env_groups=2",
            "generation=hf", "model.warm_start.steps=2", "model.warm_start.batch_size=4",
            "model.warm_start.examples_per_env=8", "render_save_dir=null",
            f"model.cache_dir={tmp_path / 'cache'}", f"output_dir={output}"]  # fmt: skip
    result = run_python(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = logged_steps(output)
    for step in (1, 2):
        row = {k.removeprefix("train/math_workflow/"): v for k, v in steps[step].items()}
        assert row["trajectories"] == 4.0 and row["failed"] == 0.0
        assert row["turns"] == 1.0  # max_turns 1 from the env config
        # both terms logged apart: score = accuracy + 0.1·(in format) − 0.1·(out of format)
        format_mean = 0.1 * (1 - row["invalid_action_rate"]) - 0.1 * row["invalid_action_rate"]
        assert row["score"] == pytest.approx(row["success"] + format_mean)
    assert steps[2]["val/math_workflow/trajectories"] == 2.0
