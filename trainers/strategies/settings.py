"""The settings every strategy of a training role takes, each declared once.

A role's strategy is built from flat keyword arguments: the role's settings
(:func:`agentgym.builders.strategy_settings`) and the strategy's own
``strategy_config`` keys. The settings every strategy shares are the fields of
:class:`ModelSettings` (a critic's) and :class:`PolicySettings` (a policy's: also
the sampling temperature and the frozen reference), with their defaults here; a
strategy's ``__init__`` names only its own options and passes the rest to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from agentgym.trainers.strategies.optim import OptimizerConfig


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """What every strategy of a training role (policy or critic) takes.

    Building one checks ``optimizer``'s schedule, so a bad one fails before a model
    is read.

    Attributes:
        dtype: Parameter dtype (``float32``, ``bfloat16``).
        device: ``cpu`` or ``cuda``.
        gradient_checkpointing: Trade compute for activation memory.
        optimizer: AdamW, its schedule and gradient clipping.
        micro_batch_size: Rows per forward pass of ``logprobs`` or ``values``.
        attn_implementation: Passed to ``from_pretrained`` (None: transformers' default).
    """

    dtype: str = "float32"
    device: str = "cpu"
    gradient_checkpointing: bool = False
    optimizer: OptimizerConfig = OptimizerConfig()
    micro_batch_size: int = 128
    attn_implementation: str | None = None

    def __post_init__(self) -> None:
        self.optimizer.schedule()

    def attention(self) -> dict[str, str]:
        """``from_pretrained``'s ``attn_implementation`` when one is set (none: the default)."""
        return {"attn_implementation": self.attn_implementation} if self.attn_implementation else {}


@dataclass(frozen=True, kw_only=True)
class PolicySettings(ModelSettings):
    """What every policy strategy takes: :class:`ModelSettings` and these.

    Attributes:
        temperature: The sampling temperature; logits are divided by it.
        reference_path: The frozen reference model's folder (None: no reference).
    """

    temperature: float = 1.0
    reference_path: str | Path | None = None


_Module = TypeVar("_Module", bound=torch.nn.Module)


def load_reference(path: str | Path | None, load: Callable[[Path], _Module]) -> _Module | None:
    """The frozen reference: ``load(path)`` in eval mode without gradients (None: no
    ``path``, no reference)."""
    if path is None:
        return None
    reference = load(Path(path))
    reference.eval().requires_grad_(False)
    return reference
