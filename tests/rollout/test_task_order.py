"""Task sets played in order: an env that asks for a task index (``uses_task_index``)
reads its task set row after row, epoch after epoch, resumes at the next row, and
validates from row 0; an env that does not ask is reset as before.

The real rollout (:func:`~agentgym.rollout.loop.collect`) plays ``math_workflow`` on
a generated GSM8K-format file, with envs in this process and on env workers (whose
resets travel over the data plane): a :class:`~agentgym.cluster.LocalCluster`'s, and
(``-m ray``) worker processes of a local Ray instance.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from agentgym.cluster import Cluster, LocalCluster, start_cluster
from agentgym.envs.adapter import GymTextEnv
from agentgym.envs.math_workflow import write_problems
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.rollout.workers import uses_task_index
from tests.rollout.envs import CountEnv, registered

ROWS = 5
CONFIG = RolloutConfig(
    mode="trajectory", max_turns=1, sequence_length=1024,
    sampling=SamplingParams(max_new_tokens=256, seed=0),
)  # fmt: skip
WHERE = ["process", "workers"]
REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    cluster = start_cluster("ray", rpc_timeout=120, env_vars={"PYTHONPATH": str(REPOSITORY)})
    try:
        yield cluster
    finally:
        cluster.shutdown()


def taskset_file(path: Path, rows: int = ROWS, seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """A generated GSM8K-format task set as a ``.jsonl`` file: its taskset keys and questions."""
    write_problems(path, rows, seed)
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines()]
    assert len(set(questions)) == rows  # a question names its row
    keys = {"path": str(path), "format": {"prompt_key": "question", "response_key": "answer"}}
    return keys, questions


def math_manager(
    taskset: dict[str, Any], where: str | Cluster, *, env_groups: int = 2, **kwargs: Any
) -> EnvManager:
    placement: dict[str, Any] = {}
    if where != "process":  # requests pickled over the workers' data plane
        cluster = LocalCluster() if where == "workers" else where
        placement = {"cluster": cluster, "max_env_num_per_worker": 3}
    return EnvManager(
        tags=["math"],
        env_configs={"math": {"name": "math_workflow", "kwargs": {"taskset": taskset}}},
        env_groups=env_groups, group_size=2, seed=3, **placement, **kwargs,
    )  # fmt: skip


@pytest.fixture
def play(tiny_tokenizer: Any) -> Any:
    """Run one batch; return its rows (by the question each group saw), group by group."""
    backend = ScriptedBackend(tiny_tokenizer, agent="solver")
    chat = ChatTokenizer(tiny_tokenizer)

    def batch(manager: EnvManager, questions: list[str]) -> list[int]:
        result = asyncio.run(collect(manager, backend, chat, CONFIG))
        groups: dict[int, list[str]] = {}
        for trajectory in result.trajectories:
            assert trajectory.termination_reason == "terminated", trajectory.error
            assert trajectory.score == pytest.approx(1.1)  # the row's own reference answer
            groups.setdefault(trajectory.group_id, []).append(trajectory.messages[1]["content"])
        for asked in groups.values():  # every member of a group plays its task
            assert len(asked) == manager.group_size and len(set(asked)) == 1
        return [questions.index(asked[0]) for _, asked in sorted(groups.items())]

    return batch


def hashed_seed(seed: int, stream: int, group: int) -> int:
    """The env manager's seed of a group, written out: SeedSequence([seed, stream, group])."""
    return int(np.random.SeedSequence([seed, stream, group]).generate_state(1)[0] & 0x7FFFFFFF)


@pytest.mark.parametrize("where", [*WHERE, pytest.param("ray", marks=pytest.mark.ray)])
def test_training_reads_rows_in_file_order_and_wraps_into_epoch_two(
    tmp_path: Path, play: Any, where: str, request: pytest.FixtureRequest
) -> None:
    taskset, questions = taskset_file(tmp_path / "gsm8k.jsonl")
    cluster = request.getfixturevalue("ray_cluster") if where == "ray" else where
    manager = math_manager(taskset, cluster)
    try:
        batches = [play(manager, questions) for _ in range(4)]
        assert batches == [[0, 1], [2, 3], [4, 0], [1, 2]]  # task i is row i % 5
        # the seeds stay the hashed ones (sampling and request seeds read them)
        assignments = manager.assignments()
        assert [[a.task_index for a in env] for env in assignments] == [[8]] * 2 + [[9]] * 2
        assert [env[0].seed for env in assignments] == [hashed_seed(3, 0, 8)] * 2 + [
            hashed_seed(3, 0, 9)
        ] * 2
    finally:
        manager.close()


@pytest.mark.parametrize("where", WHERE)
def test_resume_continues_at_the_next_row(tmp_path: Path, play: Any, where: str) -> None:
    taskset, questions = taskset_file(tmp_path / "gsm8k.jsonl")
    first = math_manager(taskset, where)
    resumed = math_manager(taskset, where)
    try:
        assert [play(first, questions) for _ in range(2)] == [[0, 1], [2, 3]]
        state = first.state_dict()
        resumed.load_state_dict(state)
        assert play(resumed, questions) == [4, 0]  # epoch 2 starts inside this batch
        assert play(resumed, questions) == [1, 2]
        assert play(first, questions) == [4, 0]  # as the run that was not stopped
    finally:
        first.close()
        resumed.close()


@pytest.mark.parametrize("where", WHERE)
def test_validation_plays_its_rows_from_zero_every_time(
    tmp_path: Path, play: Any, where: str
) -> None:
    taskset, questions = taskset_file(tmp_path / "val.jsonl", rows=7, seed=1)
    validation = math_manager(taskset, where, env_groups=3, fixed_seeds=True, max_traj_per_env=2)
    try:
        for _ in range(2):  # rounds of 3 groups: tasks 0-2, then 3-5
            assert play(validation, questions) == [0, 1, 2, 3, 4, 5]
    finally:
        validation.close()


def test_each_tag_reads_its_own_task_set_in_order(tmp_path: Path, play: Any) -> None:
    taskset_a, questions_a = taskset_file(tmp_path / "a.jsonl", rows=4, seed=2)
    taskset_b, questions_b = taskset_file(tmp_path / "b.jsonl", rows=3, seed=3)
    manager = EnvManager(
        tags=["a", "b"], n_groups=[2, 1], env_groups=3, group_size=2, seed=3,
        env_configs={
            "a": {"name": "math_workflow", "kwargs": {"taskset": taskset_a}},
            "b": {"name": "math_workflow", "kwargs": {"taskset": taskset_b}},
        },
    )  # fmt: skip
    questions = questions_a + questions_b  # b's rows are 4, 5, 6 here
    batches = [play(manager, questions) for _ in range(3)]
    assert batches == [[0, 1, 4], [2, 3, 5], [0, 1, 6]]


class IndexedCountEnv(CountEnv):
    """CountEnv that asks for a task index and records its reset options."""

    uses_task_index: ClassVar[bool] = True

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.options = options
        return super()._reset(options)


class RecordingCountEnv(CountEnv):
    """CountEnv that records whether a reset passed options."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.options = options
        return super().reset(seed=seed, options=options)


def test_only_an_env_that_asks_gets_the_option(tiny_tokenizer: Any) -> None:
    backend = ScriptedBackend(tiny_tokenizer, agent="random")
    chat = ChatTokenizer(tiny_tokenizer)
    with registered("indexed_count", IndexedCountEnv), registered("count", RecordingCountEnv):
        manager = EnvManager(
            tags=["indexed_count", "count"], env_groups=2, group_size=1, seed=7,
            max_traj_per_env=2,
        )  # fmt: skip
        config = RolloutConfig(mode="trajectory", max_turns=2, sequence_length=1024)
        asyncio.run(collect(manager, backend, chat, config))
        result = asyncio.run(collect(manager, backend, chat, config))
    indexed, plain = (slot.env for slot in manager.slots)
    assert isinstance(indexed, IndexedCountEnv) and isinstance(plain, RecordingCountEnv)
    assert [slot.task_indexed for slot in manager.slots] == [True, False]
    assert indexed.options == {"task_index": 3}  # rounds 0-3 of its tag's one group
    assert plain.options is None  # reset(seed=...) exactly as before
    # both keep the hashed seeds of their group numbers (6 and 7 in the last round)
    seeds = {t.group_id: t.seed for t in result.trajectories}
    assert seeds == {n: hashed_seed(7, 0, n) for n in (4, 5, 6, 7)}


def test_a_plain_gymnasium_env_asks_through_the_adapter() -> None:
    import gymnasium

    class Plain(gymnasium.Env[str, str]):
        """Echo the task index."""

        uses_task_index = True
        observation_space = action_space = gymnasium.spaces.Text(8)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            index = (options or {}).get("task_index")
            return "x", {"task_index": index, "action_is_valid": True, "success": False}

    class Other(Plain):
        """Does not ask."""

        uses_task_index = False

    adapted = GymTextEnv(Plain())
    assert uses_task_index(adapted)
    assert adapted.reset(seed=0, options={"task_index": 4})[1]["task_index"] == 4
    assert not uses_task_index(GymTextEnv(Other()))
