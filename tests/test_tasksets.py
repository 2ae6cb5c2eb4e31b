"""Task sets from files: the same rows in the same order from every layout, the errors
that name what exists, the wrap over epochs, resume by index, and mixing by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym.tasksets import (
    TaskCursor,
    TaskMix,
    TaskSet,
    TaskSetConfig,
    TaskSetError,
    even_interleave,
    load_taskset,
)

ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(7)]  # fmt: skip
FORMAT = {"prompt_key": "question", "response_key": "answer"}


@pytest.fixture(autouse=True)
def _dataset_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def write_layouts(root: Path) -> dict[str, Path]:
    """ROWS as a .jsonl, .json and .parquet file, save_to_disk folders and a data folder."""
    table = datasets.Dataset.from_list(ROWS)
    paths = {name: root / name for name in ("t.jsonl", "t.json", "t.parquet", "saved", "dict")}
    paths["t.jsonl"].write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    paths["t.json"].write_text(json.dumps(ROWS))
    table.to_parquet(paths["t.parquet"])
    table.save_to_disk(paths["saved"])
    held_out = datasets.Dataset.from_list(ROWS[:2])
    datasets.DatasetDict({"train": table, "test": held_out}).save_to_disk(paths["dict"])
    (root / "folder" / "data").mkdir(parents=True)
    table.to_parquet(root / "folder" / "data" / "train-00000-of-00001.parquet")
    held_out.to_parquet(root / "folder" / "data" / "test-00000-of-00001.parquet")
    paths["folder"] = root / "folder"
    return paths


def test_every_layout_loads_the_same_rows_in_file_order(tmp_path: Path) -> None:
    for name, path in write_layouts(tmp_path).items():
        tasks = load_taskset({"path": str(path), "format": FORMAT})
        assert len(tasks) == 7, name
        assert [tasks.task(i).prompt for i in range(7)] == [row["question"] for row in ROWS], name
        assert tasks.task(3).response == ROWS[3]["answer"]
        assert tasks.task(3).raw == ROWS[3]


def test_split_and_name(tmp_path: Path) -> None:
    paths = write_layouts(tmp_path)
    for layout in ("dict", "folder"):
        test = load_taskset({"path": str(paths[layout]), "split": "test", "format": FORMAT})
        assert [test.task(i).prompt for i in range(2)] == [ROWS[0]["question"], ROWS[1]["question"]]
    assert load_taskset({"path": str(paths["t.jsonl"]), "format": FORMAT}).name == "t"
    named = {"path": str(paths["t.jsonl"]), "name": "gsm8k", "format": FORMAT}
    assert load_taskset(named).task(0).taskset == "gsm8k"


def test_tasks_wrap_over_epochs_in_file_order(tmp_path: Path) -> None:
    tasks = load_taskset({"path": str(write_layouts(tmp_path)["t.jsonl"]), "format": FORMAT})
    task = tasks.task(7 * 2 + 3)  # third epoch, row 3
    assert (task.row, task.epoch, task.prompt) == (3, 2, ROWS[3]["question"])
    with pytest.raises(ValueError, match=">= 0"):
        tasks.task(-1)


def test_a_wrong_key_names_the_columns_that_exist(tmp_path: Path) -> None:
    path = str(write_layouts(tmp_path)["t.parquet"])
    with pytest.raises(
        TaskSetError, match=r"prompt_key='questoin'.*'question'\?.*\['question', 'answer']"
    ):
        load_taskset({"path": path, "format": {"prompt_key": "questoin", "response_key": "answer"}})
    # Trinity's defaults are prompt/response: a GSM8K file needs its format keys
    with pytest.raises(TaskSetError, match=r"prompt_key='prompt' names no column"):
        load_taskset({"path": path})


def test_bad_keys_splits_and_paths_say_what_exists(tmp_path: Path) -> None:
    paths = write_layouts(tmp_path)
    with pytest.raises(TaskSetError, match=r"taskset.splt .*'split'\?"):
        load_taskset({"path": str(paths["t.json"]), "splt": "test"})
    with pytest.raises(TaskSetError, match=r"taskset.format.prompt .*'prompt_key'\?"):
        load_taskset({"path": str(paths["t.json"]), "format": {"prompt": "question"}})
    with pytest.raises(
        TaskSetError, match=r"no split 'tset'. Did you mean 'test'\? .*\['train', 'test']"
    ):
        load_taskset({"path": str(paths["dict"]), "split": "tset", "format": FORMAT})
    with pytest.raises(TaskSetError, match="is not a file or folder here"):
        load_taskset({"path": str(tmp_path / "missing.jsonl"), "format": FORMAT})
    with pytest.raises(TaskSetError, match="single file"):
        load_taskset({"path": str(paths["t.json"]), "subset_name": "main", "format": FORMAT})
    (tmp_path / "t.csv").write_text("question,answer\n")
    with pytest.raises(TaskSetError, match=r"'.csv' files are not read"):
        load_taskset({"path": str(tmp_path / "t.csv"), "format": FORMAT})
    with pytest.raises(TaskSetError, match="path is missing"):
        TaskSetConfig.from_mapping({"split": "train"})


def sequence(count: int) -> TaskSet:
    rows = [{"prompt": f"p{i}", "response": str(i)} for i in range(count)]
    return TaskSet(datasets.Dataset.from_list(rows), name=f"set{count}")


def test_cursor_reads_epochs_and_resumes_at_the_next_task() -> None:
    tasks = sequence(5)
    cursor = TaskCursor(tasks, total_epochs=2)
    first = [[t.prompt for t in cursor.read(3)] for _ in range(2)]
    assert first == [["p0", "p1", "p2"], ["p3", "p4", "p0"]]  # the second epoch follows on
    state = cursor.state_dict()
    assert state == {"index": 6}
    resumed = TaskCursor(tasks, total_epochs=2)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    assert [t.prompt for t in resumed.read(3)] == ["p1", "p2", "p3"]
    assert [t.prompt for t in cursor.read(3)] == ["p1", "p2", "p3"]
    with pytest.raises(StopIteration):  # 10 tasks in 2 epochs: 1 left, dropped
        cursor.read(3)
    last = TaskCursor(tasks, total_epochs=2, drop_last=False, index=9)
    assert [t.prompt for t in last.read(3)] == ["p4"]  # evaluation keeps a short last batch
    with pytest.raises(StopIteration):
        last.read(3)


def test_even_interleave_by_hand() -> None:
    assert even_interleave({"a": 2, "b": 1}) == [("a", 0), ("b", 0), ("a", 1)]
    assert even_interleave({"a": 1, "b": 1}) == [("a", 0), ("b", 0)]
    assert even_interleave({"a": 3, "b": 1}) == [("a", 0), ("a", 1), ("b", 0), ("a", 2)]


@given(st.dictionaries(st.sampled_from("abcde"), st.integers(1, 6), min_size=1))
def test_a_cycle_holds_each_weight_once_in_order(weights: dict[str, int]) -> None:
    cycle = even_interleave(weights)
    assert len(cycle) == sum(weights.values())
    for name, weight in weights.items():
        assert [k for n, k in cycle if n == name] == list(range(weight))


def test_mix_interleaves_by_weight_and_each_set_wraps_on_its_own() -> None:
    mix = TaskMix([sequence(3), sequence(2)], weights={"set3": 2})
    order = [(t.taskset, t.prompt) for t in (mix.task(i) for i in range(9))]
    assert order == [
        ("set3", "p0"), ("set2", "p0"), ("set3", "p1"),
        ("set3", "p2"), ("set2", "p1"), ("set3", "p0"),
        ("set3", "p1"), ("set2", "p0"), ("set3", "p2"),
    ]  # fmt: skip
    assert len(mix) == 6  # 3 rows at 2 a cycle: 2 cycles of 3 tasks
    cursor = TaskCursor(mix, index=4)  # resume mid-cycle
    assert [t.prompt for t in cursor.read(2)] == ["p1", "p0"]


def test_mix_errors_name_the_sets() -> None:
    with pytest.raises(TaskSetError, match="different names"):
        TaskMix([sequence(3), sequence(3)])
    with pytest.raises(TaskSetError, match=r"'set4'.*'set3'\?"):
        TaskMix([sequence(3), sequence(2)], weights={"set4": 2})
    with pytest.raises(TaskSetError, match="whole number >= 1"):
        TaskMix([sequence(3)], weights={"set3": 0})


def test_the_response_column_may_be_left_out_when_not_needed(tmp_path: Any) -> None:
    rows = datasets.Dataset.from_list([{"prompt": "p"}])
    assert TaskSet(rows, name="x", require_response=False).task(0).response is None
    with pytest.raises(TaskSetError, match=r"response_key='response'.*\['prompt'\]"):
        TaskSet(rows, name="x")
