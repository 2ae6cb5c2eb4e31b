"""The policy's model folder: a local Hugging Face folder (``pretrain``), or the tiny
model built once from ``model.tiny``."""

from __future__ import annotations

from pathlib import Path

from agentgym.models.cache import ensure_tiny_model
from agentgym.schema import TrainConfig


def model_path(config: TrainConfig) -> Path:
    """The policy's folder: ``pretrain`` (ROLL's key; ``model.path`` feeds it; the config
    check made sure it is a model folder), or the tiny model built once from
    ``model.tiny`` and warm-started per ``model.warm_start``."""
    if config.pretrain:
        return Path(config.pretrain).expanduser()
    model = config.model
    return ensure_tiny_model(model.tiny, model.cache_dir, warm_start=model.warm_start)
