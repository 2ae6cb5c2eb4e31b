"""The data a GEM env would fetch from a hub (``dataset_name``), read from a local file.

GEM's math, QA and code envs call ``datasets.load_dataset(dataset_name)``; they also take
a ready ``dataset``. Here ``dataset_name`` may be a local ``.jsonl``/``.json``/``.parquet``
file or a ``datasets`` folder (what :mod:`agentgym.tasksets` reads), and the env gets its
rows as ``dataset``. A hub id (``axon-rl/GSM-8k``) is read from the hub only with
``hub_datasets=True`` (a machine with the network); otherwise it is a config error naming
the key and the local forms, never a hang on a download.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentgym.errors import ConfigError
from agentgym.tasksets import FILE_BUILDERS, TaskSetConfig, read_rows

if TYPE_CHECKING:
    import datasets  # type: ignore[import-untyped]

LOCAL_FORMS = (
    "a .jsonl, .json or .parquet file, or a datasets folder (save_to_disk, or data files "
    "as datasets.load_dataset reads them)"
)


class HubDatasetError(ConfigError):
    """A GEM env names a hub dataset that this machine cannot read."""


def local_dataset(name: str, split: str | None, key: str) -> datasets.Dataset:
    """The rows of ``name`` (a local file or folder), ``split`` of it where it has splits.

    Args:
        name: The env's ``dataset_name``.
        split: The split GEM would take (None: the only one, or ``train``).
        key: The config key that gave ``name``, for the error message.

    Raises:
        HubDatasetError: If ``name`` is not a local file or folder.
        TaskSetError: If it is, but cannot be read as asked.
    """
    path = Path(name).expanduser()
    if not (path.is_file() or path.is_dir()):
        kind = "a hub dataset id" if "/" in name and not path.suffix else "not a file or folder"
        raise HubDatasetError(
            f"{key}={name!r} is {kind}, and this env reads its data from a local copy: give "
            f"{LOCAL_FORMS}, with the hub dataset's columns ({key}=/data/gsm8k.jsonl). On a "
            "machine with the network, env.kwargs.hub_datasets=true lets GEM download it"
        )
    if path.is_file() and path.suffix.lower() not in FILE_BUILDERS:
        raise HubDatasetError(
            f"{key}={name!r}: {path.suffix!r} files are not read; give {LOCAL_FORMS}"
        )
    return read_rows(TaskSetConfig(path=str(path), split=split or "train"))
