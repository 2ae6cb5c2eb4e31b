"""Task sets from dataset files, with Trinity-RFT's taskset keys.

A task set is a table of rows read with the ``datasets`` library from a local
``.jsonl``, ``.json`` or ``.parquet`` file, a folder written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or a folder of data
files as ``datasets.load_dataset`` reads it (``data/train-*.parquet``, a README
with ``configs``). Its keys are those of Trinity-RFT's ``TasksetConfig``:
``name``, ``path``, ``subset_name``, ``split`` (default ``train``) and
``format.prompt_key`` / ``format.response_key`` (defaults ``prompt`` and
``response``). Like Trinity's file reader (``_HFBatchReader``), tasks come in
file order and wrap around: task ``i`` is row ``i % len``, of epoch
``i // len``; so an index is all that a resume needs. :class:`TaskCursor` reads
them in batches for ``total_epochs`` epochs and checkpoints its index, as
Trinity's ``index`` does.

Several task sets mix by name (:class:`TaskMix`): each has a whole-number
weight, and every cycle of ``sum(weights)`` tasks takes ``weight`` tasks of
each set, interleaved evenly, each set keeping its own file order.
docs/tasksets.md describes how envs map reset seeds to tasks.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    import datasets  # type: ignore[import-untyped]

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""File extension → the ``datasets`` builder that reads it."""

TASKSET_KEYS = ("name", "path", "subset_name", "split", "format")
"""The taskset keys read here (Trinity's ``TasksetConfig`` keys for a file)."""

FORMAT_KEYS = ("prompt_key", "response_key")
"""The ``format`` keys read here (Trinity's ``FormatConfig`` keys for a task)."""


class TaskSetError(ConfigError):
    """A task set cannot be read as configured; the message names the fix."""


@dataclass(frozen=True)
class TaskSetConfig:
    """Where a task set's rows are and which columns hold the prompt and the answer.

    Attributes:
        path: A local ``.jsonl`` / ``.json`` / ``.parquet`` file, a ``datasets``
            folder (``save_to_disk``, or data files as ``load_dataset`` reads them),
            or a Hub dataset name (``openai/gsm8k``; needs the network).
        name: The set's name in a :class:`TaskMix` and in task records; defaults
            to the file or folder name.
        subset_name: The dataset configuration (``load_dataset``'s ``name``), for
            a folder of data files or a Hub dataset.
        split: The split to read.
        prompt_key: The column of the prompt (Trinity's ``format.prompt_key``).
        response_key: The column of the reference answer (``format.response_key``).
    """

    path: str
    name: str = ""
    subset_name: str | None = None
    split: str = "train"
    prompt_key: str = "prompt"
    response_key: str = "response"

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> TaskSetConfig:
        """A config from Trinity's nested keys (``format: {prompt_key, response_key}``).

        Raises:
            TaskSetError: On a key not read here (with the close match) or no ``path``.
        """
        _check_keys("taskset", mapping, TASKSET_KEYS)
        fmt = mapping.get("format") or {}
        _check_keys("taskset.format", fmt, FORMAT_KEYS)
        if not mapping.get("path"):
            raise TaskSetError(
                "taskset.path is missing: give a .jsonl, .json or .parquet file "
                "or a datasets folder"
            )
        values = {key: mapping[key] for key in ("subset_name", "split") if mapping.get(key)}
        values |= {key: str(fmt[key]) for key in FORMAT_KEYS if fmt.get(key)}
        return cls(path=str(mapping["path"]), name=str(mapping.get("name") or ""), **values)

    @property
    def label(self) -> str:
        """The set's name: ``name``, else the file or folder name without extension."""
        return self.name or Path(self.path).stem


def _check_keys(where: str, mapping: Mapping[str, Any], known: Sequence[str]) -> None:
    for key in mapping:
        if key not in known:
            raise TaskSetError(
                f"{where}.{key} is not a key read here.{did_you_mean(key, known)} "
                f"Valid keys: {list(known)}."
            )


@dataclass(frozen=True)
class Task:
    """One task of a task set.

    Attributes:
        prompt: The prompt column's value, as text.
        response: The reference answer column's value, as text (None where the
            set has no such column and none was asked for).
        taskset: The name of the set it came from.
        row: Its row in the set's file order.
        epoch: How many times the set was gone through before it.
        raw: The whole row.
    """

    prompt: str
    response: str | None
    taskset: str
    row: int
    epoch: int
    raw: Mapping[str, Any] = field(repr=False)


class TaskSet:
    """The rows of one task set, in file order; task ``i`` is row ``i % len(self)``.

    Args:
        dataset: The rows (a ``datasets.Dataset``).
        name: The set's name.
        prompt_key: The prompt column.
        response_key: The reference answer column; need not exist when the
            caller has no use for references (``require_response=False``).
        require_response: Whether a missing ``response_key`` column is an error.

    Raises:
        TaskSetError: If the set is empty or a key names no column (the error
            lists the columns that exist).
    """

    def __init__(
        self,
        dataset: datasets.Dataset,
        *,
        name: str,
        prompt_key: str = "prompt",
        response_key: str = "response",
        require_response: bool = True,
    ) -> None:
        columns = list(dataset.column_names)
        keys = [("format.prompt_key", prompt_key)]
        if require_response:
            keys.append(("format.response_key", response_key))
        for key, column in keys:
            if column not in columns:
                raise TaskSetError(
                    f"task set {name!r}: {key}={column!r} names no column."
                    f"{did_you_mean(column, columns)} Its columns: {columns}."
                )
        if len(dataset) == 0:
            raise TaskSetError(f"task set {name!r} has no rows")
        self.dataset = dataset
        self.name = name
        self.prompt_key = prompt_key
        self.response_key = response_key if response_key in columns else None

    def __len__(self) -> int:
        return len(self.dataset)

    def task(self, index: int) -> Task:
        """Task ``index`` of the endless file-order sequence: row ``index % len``.

        Raises:
            ValueError: If ``index`` is negative.
        """
        if index < 0:
            raise ValueError(f"task index must be >= 0, got {index}")
        epoch, row = divmod(index, len(self))
        raw = self.dataset[row]
        response = None if self.response_key is None else _text(raw[self.response_key])
        return Task(_text(raw[self.prompt_key]), response, self.name, row, epoch, raw)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def load_taskset(config: TaskSetConfig | Mapping[str, Any], **kwargs: Any) -> TaskSet:
    """Read a task set (once per process and config: envs of a run share it).

    Args:
        config: A :class:`TaskSetConfig`, or a mapping of Trinity's taskset keys.
        **kwargs: :class:`TaskSet` options (``require_response``).

    Returns:
        The task set.

    Raises:
        TaskSetError: On a bad key, a missing file, a split or subset that does
            not exist (the error lists those that do), or a key that names no column.
    """
    if not isinstance(config, TaskSetConfig):
        config = TaskSetConfig.from_mapping(config)
    return _load(config, **kwargs)


@functools.lru_cache(maxsize=16)
def _load(config: TaskSetConfig, require_response: bool = True) -> TaskSet:
    return TaskSet(
        read_rows(config),
        name=config.label,
        prompt_key=config.prompt_key,
        response_key=config.response_key,
        require_response=require_response,
    )


def read_rows(config: TaskSetConfig) -> datasets.Dataset:
    """The split's rows as a ``datasets.Dataset``, in file order (see :class:`TaskSetConfig`).

    Raises:
        TaskSetError: As :func:`load_taskset`.
    """
    import datasets

    path = Path(config.path).expanduser()
    if path.is_file():
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise TaskSetError(
                f"taskset.path={config.path!r}: {path.suffix!r} files are not read; "
                f"give one of {sorted(FILE_BUILDERS)} or a datasets folder"
            )
        if config.subset_name:
            raise TaskSetError(
                f"taskset.subset_name={config.subset_name!r} needs a folder or a Hub dataset; "
                f"{config.path!r} is a single file (drop subset_name)"
            )
        loaded = datasets.load_dataset(builder, data_files={"train": str(path)})
        return _split(loaded, config)
    if path.is_dir() and _saved_to_disk(path):
        if config.subset_name:
            raise TaskSetError(
                f"taskset.subset_name={config.subset_name!r}: {config.path!r} was written by "
                "save_to_disk and has no subsets (drop subset_name)"
            )
        return _split(datasets.load_from_disk(str(path)), config)
    if path.is_dir() or _hub_name(config.path):
        try:
            loaded = datasets.load_dataset(
                str(path) if path.is_dir() else config.path,
                name=config.subset_name,
                cache_dir=_folder_cache(path) if path.is_dir() else None,
            )
        except ValueError as error:  # an unknown subset: datasets lists the valid ones
            raise TaskSetError(f"taskset {config.path!r}: {error}") from error
        return _split(loaded, config)
    raise TaskSetError(
        f"taskset.path={config.path!r} is not a file or folder here; give a .jsonl, .json or "
        ".parquet file, a save_to_disk folder, a folder of data files, or a Hub name (owner/name)"
    )


def _folder_cache(path: Path) -> str:
    """A ``datasets`` cache folder for the data folder ``path``, keyed by its absolute path
    and its files' sizes and times: ``datasets`` keys a folder's cache by its files'
    paths *relative to the folder*, so two folders of one layout (``gsm8k/main/
    train.jsonl``) would share one cache and the second would read the first's rows."""
    import hashlib

    from datasets import config as datasets_config

    digest = hashlib.sha256(str(path.resolve()).encode())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    root = Path(datasets_config.HF_DATASETS_CACHE) / "agentgym-folders"
    return str(root / digest.hexdigest()[:16])


def _saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _hub_name(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not Path(path).suffix


def _split(loaded: Any, config: TaskSetConfig) -> datasets.Dataset:
    import datasets

    if isinstance(loaded, datasets.Dataset):  # a save_to_disk folder of one split
        return loaded
    splits = list(loaded)
    if config.split not in splits:
        raise TaskSetError(
            f"taskset {config.path!r} has no split {config.split!r}."
            f"{did_you_mean(config.split, splits)} Its splits: {splits}."
        )
    dataset: datasets.Dataset = loaded[config.split]
    return dataset


class TaskMix:
    """Several task sets mixed by name, in a fixed interleaved order.

    Every cycle of ``sum(weights)`` tasks holds ``weights[name]`` tasks of each
    set, spread evenly through the cycle (a set of weight 2 in a cycle of 3 is
    at positions 0 and 2 or so), and each set goes through its own rows in
    file order, wrapping around on its own. Task ``i`` of the mix depends on
    ``i`` alone, so an index resumes it exactly.

    Args:
        tasksets: The sets; their names must differ.
        weights: Name → whole-number weight >= 1; None: 1 each.

    Raises:
        TaskSetError: On repeated names, a weight for an unknown name, or a
            weight below 1.
    """

    def __init__(self, tasksets: Sequence[TaskSet], weights: Mapping[str, int] | None = None):
        names = [taskset.name for taskset in tasksets]
        if not names or len(set(names)) != len(names):
            raise TaskSetError(
                f"a task mix needs task sets with different names, got {names}; "
                "set each taskset's name"
            )
        weights = dict(weights or {})
        for name, weight in weights.items():
            if name not in names:
                raise TaskSetError(
                    f"task mix weight for {name!r}: no task set of that name."
                    f"{did_you_mean(name, names)} Task sets: {names}."
                )
            if int(weight) != weight or weight < 1:
                raise TaskSetError(
                    f"task mix weight of {name!r} must be a whole number >= 1, got {weight}"
                )
        self.tasksets = {taskset.name: taskset for taskset in tasksets}
        self.weights = {name: int(weights.get(name, 1)) for name in names}
        self.cycle = even_interleave(self.weights)

    def __len__(self) -> int:
        """Tasks in one pass over the largest set at its share of the mix."""
        period = len(self.cycle)
        return max(
            math.ceil(len(self.tasksets[name]) / weight) * period
            for name, weight in self.weights.items()
        )

    def task(self, index: int) -> Task:
        """Task ``index`` of the mix (see the class docstring)."""
        if index < 0:
            raise ValueError(f"task index must be >= 0, got {index}")
        cycles, position = divmod(index, len(self.cycle))
        name, rank = self.cycle[position]
        return self.tasksets[name].task(cycles * self.weights[name] + rank)


def even_interleave(weights: Mapping[str, int]) -> list[tuple[str, int]]:
    """One cycle of a weighted mix: ``(name, k)`` for the k-th task of ``name`` in the cycle.

    Name ``n`` of weight ``w`` is placed at the ``w`` positions whose ideal times
    ``(k + 0.5) / w`` are spread over the cycle; ties go in the weights' order.

    >>> even_interleave({"a": 2, "b": 1})
    [('a', 0), ('b', 0), ('a', 1)]
    """
    order = {name: position for position, name in enumerate(weights)}
    slots = [
        ((k + 0.5) / weight, order[name], name, k)
        for name, weight in weights.items()
        for k in range(weight)
    ]
    return [(name, k) for _, _, name, k in sorted(slots)]


class TaskCursor:
    """Reads tasks in order in batches, for ``total_epochs`` passes, and resumes by index.

    Trinity's reader semantics: ``read(n)`` returns the next ``n`` tasks; once
    ``total_epochs × len(tasks)`` tasks were read it raises ``StopIteration``,
    and a last batch that cannot be filled is dropped (``drop_last``) or
    returned short. :meth:`state_dict` is the index a checkpoint stores.

    Args:
        tasks: A :class:`TaskSet` or :class:`TaskMix`.
        total_epochs: Passes over the tasks.
        drop_last: Drop a last short batch (training) or return it (evaluation).
        index: Where to start (a restored checkpoint's index).
    """

    def __init__(
        self,
        tasks: TaskSet | TaskMix,
        *,
        total_epochs: int = 1,
        drop_last: bool = True,
        index: int = 0,
    ) -> None:
        if total_epochs < 1:
            raise ValueError(f"total_epochs must be >= 1, got {total_epochs}")
        self.tasks = tasks
        self.total = len(tasks) * total_epochs
        self.drop_last = drop_last
        self.index = index

    def read(self, batch_size: int) -> list[Task]:
        """The next ``batch_size`` tasks.

        Raises:
            StopIteration: When the epochs are used up (or only a short batch is
                left and ``drop_last`` is set).
        """
        left = self.total - self.index
        if left <= 0 or (left < batch_size and self.drop_last):
            raise StopIteration
        count = min(batch_size, left)
        batch = [self.tasks.task(self.index + k) for k in range(count)]
        self.index += count
        return batch

    def state_dict(self) -> dict[str, int]:
        """The index of the next task, for checkpoints."""
        return {"index": self.index}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume at :meth:`state_dict`'s index."""
        self.index = int(state["index"])
