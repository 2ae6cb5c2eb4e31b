"""MathWorkflowEnv: Trinity-RFT's single-turn ``math_workflow`` as a text env."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agentgym.envs.math_workflow.problems import GENERATOR_VERSION, generate_problems
from agentgym.envs.math_workflow.reward import SYSTEM_PROMPT, math_reward, reference_answer
from agentgym.envs.parsing import ParsedResponse, strip_stray_tokens
from agentgym.envs.text_env import TextEnv, TurnResult, require_reset
from agentgym.tasksets import Task, TaskMix, TaskSet, TaskSetError, load_taskset

_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")
GENERATED_NAME = "gsm8k_generated"
"""The name of the generated task set."""

_FORMAT_ERROR = "response does not follow <think>...</think><answer>...</answer>"


class MathWorkflowEnv(TextEnv):
    """Trinity-RFT's ``math_workflow``: one question, one answer, Trinity's math reward.

    The system prompt is Trinity's; the question is the user message. The episode
    ends after one response, rewarded with Trinity's ``MathRewardFn``: accuracy
    (``math_verify`` on the ``<answer>`` text, or the whole response, against the
    reference; 1 or 0) plus +0.1 for ``<think>...</think><answer>...</answer>``,
    ``format_penalty`` (-0.1, Trinity's) otherwise. A response out of format is
    an invalid turn (``invalid_action_rate`` is the share of responses without
    the format) and ``success`` is an accurate answer, so the two terms are
    logged apart; ``info`` holds both (``accuracy``, ``format_score``).

    The reset option ``task_index`` picks the task: task ``i`` is row
    ``i % len`` of the task set, in file order, of epoch ``i // len``. The env
    asks the env manager for it (``uses_task_index``), which numbers the groups
    of a run 0, 1, 2, ... (validation's from 0 each time), so training reads
    the set in order, epoch after epoch, and resumes at the exact task
    (docs/tasksets.md). Reset without the option, the seed picks the task:
    ``seed % len(tasks)``.

    Args:
        taskset: Trinity's taskset keys (``path``, ``subset_name``, ``split``,
            ``format: {prompt_key, response_key}``, ``name``); a list of them
            mixes the sets by name (each may add ``weight``); None: generated
            GSM8K-format problems (``num_problems`` of them from ``problems_seed``).
        system_prompt: The system prompt; None: Trinity's.
        format_bonus: The format term of a response in format (+0.1, Trinity's).
        num_problems: Problems generated when no taskset is given.
        problems_seed: Their seed.
        **kwargs: :class:`TextEnv` options (``format_penalty``: the format term
            of a response out of format, -0.1 by default as in Trinity).
    """

    generator_version: ClassVar[int | None] = GENERATOR_VERSION
    uses_task_index: ClassVar[bool] = True

    def __init__(
        self,
        *,
        taskset: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        system_prompt: str | None = None,
        format_bonus: float = 0.1,
        num_problems: int = 1000,
        problems_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=1, **kwargs)
        self.tasks = build_tasks(taskset, num_problems=num_problems, problems_seed=problems_seed)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.format_bonus = float(format_bonus)
        self.task: Task | None = None
        self.task_index = 0
        self._accurate = False

    @property
    def instructions(self) -> str:
        """The system prompt: Trinity's ``math_workflow`` prompt unless one was given."""
        return self.system_prompt

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        index = options.get("task_index")
        if index is None:
            index = self.np_random_seed % len(self.tasks)
        self.task_index = int(index)
        self.task = self.tasks.task(self.task_index)
        self._accurate = False
        return {"task_index": self.task_index, "taskset": self.task.taskset}

    def _parse(self, text: str) -> ParsedResponse:
        # vLLM's text leaves special tokens out, as Trinity's response_text does
        text = strip_stray_tokens(text)
        return ParsedResponse(actions=(text,), is_valid=True)

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        score = math_reward(parsed.actions[0], self._task.response or "")
        self._accurate = score.accuracy == 1.0
        format_term = self.format_bonus if score.format_ok else self.format_penalty
        return TurnResult(
            reward=score.accuracy + (self.format_bonus if score.format_ok else 0.0),
            terminated=True,
            valid=score.format_ok,  # out of format: the base class adds format_penalty
            error=None if score.format_ok else _FORMAT_ERROR,
            info={"accuracy": score.accuracy, "format_score": format_term},
        )

    def _observation(self) -> str:
        return self._task.prompt

    def _success(self) -> bool:
        return self._accurate

    @property
    def _task(self) -> Task:
        return require_reset(self.task)

    def oracle_response(self) -> str:
        """A response in format with the reference's worked solution and final answer."""
        truth = self._task.response or ""
        final = reference_answer(truth)
        steps = _CALCULATOR_NOTE.sub("", truth.rpartition("####")[0]).strip() or final
        return f"<think>{steps}</think>\n<answer>{final.replace(',', '')}</answer>"


@functools.lru_cache(maxsize=4)
def generated_tasks(num_problems: int, problems_seed: int) -> TaskSet:
    """The generated GSM8K-format problems as a task set (built once per process)."""
    import datasets  # type: ignore[import-untyped]

    rows = datasets.Dataset.from_list(generate_problems(num_problems, problems_seed))
    return TaskSet(rows, name=GENERATED_NAME, prompt_key="question", response_key="answer")


def build_tasks(
    taskset: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
    *,
    num_problems: int = 1000,
    problems_seed: int = 0,
) -> TaskSet | TaskMix:
    """The env's tasks: one task set, a mix of several (each with an optional
    ``weight``), or the generated GSM8K-format problems when ``taskset`` is None.

    Raises:
        TaskSetError: As :func:`agentgym.tasksets.load_taskset`, or on an empty list.
    """
    if taskset is None:
        return generated_tasks(num_problems, problems_seed)
    if isinstance(taskset, Mapping):
        return load_taskset(dict(taskset))
    if not taskset:
        raise TaskSetError("taskset is an empty list: give one taskset or several to mix")
    sets, weights = [], {}
    for entry in taskset:
        config = dict(entry)
        weight = config.pop("weight", 1)
        loaded = load_taskset(config)
        sets.append(loaded)
        weights[loaded.name] = weight
    return TaskMix(sets, weights)
