"""The FSDP2 strategy (``strategy_name: fsdp2_train``): torch's ``fully_shard`` over a
device mesh, ROLL's ``strategy_config`` keys, sharded checkpoints with
``torch.distributed.checkpoint``. Needs no package beyond torch and transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym.trainers.strategies.lora import refuse_lora


def build_fsdp2(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Any:
    """Build :class:`~agentgym.trainers.strategies.fsdp2.strategy.FSDP2Strategy`, its
    ``strategy_config`` checked first (before any model is loaded).

    Raises:
        ConfigError: On a key it cannot honour or does not know (naming each).
        ValueError: On a LoRA adapter (``lora``): built on the torch strategy only.
    """
    refuse_lora("fsdp2_train", settings)
    from agentgym.trainers.strategies.fsdp2.options import check_config
    from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy

    check_config(strategy_config)
    return FSDP2Strategy(model_path, **settings, **strategy_config)
