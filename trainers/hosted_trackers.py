"""The trackers that keep a run on a service: Weights & Biases and SwanLab, each offline
unless an API key or a mode says otherwise.

Both take the same :class:`HostedRun` (the run's folder, name, config and id) and the
service's own ``init`` arguments. wandb and SwanLab are imported only when a tracker
is made (or :func:`~agentgym.trainers.tracking.make_tracker` checks their arguments).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.trainers.local_trackers import as_float, plain

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostedRun:
    """What a hosted tracker's run is: the same for wandb and SwanLab.

    Attributes:
        logging_dir: The run's files go under ``logging_dir/<service>`` (unless the
            service's own folder argument is given).
        exp_name: The run name (unless ``name`` is given).
        config: The run config.
        run_id: The run id; an existing run with this id is continued (``resume="allow"``).
    """

    logging_dir: str | Path
    exp_name: str
    config: Mapping[str, Any] | None = None
    run_id: str | None = None


class WandbTracker:
    """A Weights & Biases run; offline unless an API key or a mode says otherwise.

    The run is offline when neither ``mode`` nor ``WANDB_MODE`` is given and
    neither ``api_key`` nor ``WANDB_API_KEY`` is set; upload it later with
    ``wandb sync <dir>/wandb/offline-run-*``.

    Args:
        run: The run's folder (its files go under ``logging_dir/wandb`` unless ``dir``
            is given), name, config and id.
        **init_kwargs: Passed to ``wandb.init`` (``project``, ``entity``, ``tags``,
            ``mode``, ...), overriding the above; ``api_key`` goes into its settings.

    Raises:
        ImportError: When wandb is not installed.
    """

    def __init__(self, run: HostedRun, /, **init_kwargs: Any) -> None:
        wandb = import_wandb()
        kwargs, api_key = _run_kwargs("WANDB", {"dir": str(run.logging_dir)}, run, init_kwargs)
        if api_key is not None:
            kwargs["settings"] = wandb.Settings(api_key=api_key)
        if kwargs.get("dir"):
            Path(kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(**kwargs)
        self.run_id: str | None = self._run.id
        self.offline = bool(self._run.offline)
        if self.offline:
            logger.info("wandb runs offline; files in %s", Path(self._run.dir).parent)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` to the run at ``step``."""
        self._run.log({key: as_float(key, value) for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run."""
        run_dir = Path(self._run.dir).parent
        self._run.finish()
        if self.offline:
            logger.info("wandb offline run saved; upload it with: wandb sync %s", run_dir)


class SwanLabTracker:
    """A SwanLab run (ROLL's ``track_with: swanlab``); offline unless a key or a mode says
    otherwise.

    The run is offline when neither ``mode`` nor ``SWANLAB_MODE`` is given and
    neither ``api_key`` nor ``SWANLAB_API_KEY`` is set; upload it later with
    ``swanlab sync <logging_dir>/swanlab/run-*``.

    Args:
        run: The run's folder (its files go under ``logging_dir/swanlab`` unless
            ``log_dir`` is given), experiment name, config and id.
        **init_kwargs: Passed to ``swanlab.init`` (``project``, ``workspace``, ``tags``,
            ``mode``, ...), overriding the above; ``api_key`` logs in first.

    Raises:
        ImportError: When SwanLab is not installed.
    """

    def __init__(self, run: HostedRun, /, **init_kwargs: Any) -> None:
        swanlab = import_swanlab()
        location = {"log_dir": str(Path(run.logging_dir) / "swanlab")}
        kwargs, api_key = _run_kwargs("SWANLAB", location, run, init_kwargs)
        if api_key is not None:
            swanlab.login(api_key=api_key)
        Path(kwargs["log_dir"]).mkdir(parents=True, exist_ok=True)
        self._run = swanlab.init(**kwargs)
        self.run_id: str | None = self._run.id
        self.offline = kwargs.get("mode") == "offline"

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` to the run at ``step``."""
        self._run.log({key: as_float(key, value) for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run."""
        self._run.finish()


def _run_kwargs(
    service: str,
    location: Mapping[str, str],
    run: HostedRun,
    init_kwargs: Mapping[str, Any],
) -> tuple[dict[str, Any], str | None]:
    """The keyword arguments of a hosted tracker's ``init`` (wandb, SwanLab) and the
    API key taken out of them.

    The run is named ``run.exp_name`` in the ``agentgym`` project, written at
    ``location``, continued when ``run.run_id`` names an existing one
    (``resume="allow"``); ``init_kwargs`` override all of it. It is offline unless a
    ``mode``, ``<service>_MODE``, the key or ``<service>_API_KEY`` says otherwise.

    Args:
        service: The environment variables' prefix (``WANDB``, ``SWANLAB``).
        location: Where the run's files go (the ``init`` keyword and the folder).
        run: The run's name, config and id.
        init_kwargs: The user's ``init`` arguments (``api_key`` among them or not).

    Returns:
        ``(kwargs, api_key)``.
    """
    kwargs: dict[str, Any] = {
        "project": "agentgym",
        "name": run.exp_name,
        **location,
        "config": plain(run.config) if run.config is not None else None,
        "id": run.run_id,
        "resume": "allow",
    }
    kwargs.update(init_kwargs)
    api_key = kwargs.pop("api_key", None)
    has_key = api_key is not None or bool(os.environ.get(f"{service}_API_KEY"))
    if kwargs.get("mode") is None and not os.environ.get(f"{service}_MODE") and not has_key:
        kwargs["mode"] = "offline"
    return kwargs, api_key


def import_wandb() -> Any:
    """The ``wandb`` module; an :class:`ImportError` that says what to install without it."""
    try:
        import wandb
    except ImportError as error:
        raise ImportError(
            "track_with=wandb needs Weights & Biases: pip install 'agentgym[wandb]' "
            "(or drop wandb from track_with)"
        ) from error
    return wandb


def import_swanlab() -> Any:
    """The ``swanlab`` module; an :class:`ImportError` that says what to install without it."""
    try:
        import swanlab  # type: ignore[import-untyped]
    except ImportError as error:
        raise ImportError(
            "track_with=swanlab needs SwanLab: pip install 'agentgym[swanlab]', or drop "
            "swanlab from track_with"
        ) from error
    return swanlab
