"""The Megatron strategy (``strategy_name: megatron_train``): megatron-core's
``GPTModel`` with tensor, pipeline and data parallelism, Hugging Face weights in
and out. The only package that imports ``megatron.core`` (``pip install
agentgym[megatron]``); on a machine without CUDA it runs in the CPU mode of
:mod:`~agentgym.trainers.strategies.megatron.cpu` (development and CI).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgym.trainers.strategies.lora import refuse_lora


def build_megatron(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Any:
    """Build :class:`~agentgym.trainers.strategies.megatron.strategy.MegatronStrategy`.

    Raises:
        ImportError: When megatron-core is not installed (names the extra).
        ValueError: On a LoRA adapter (``lora``): built on the torch strategy only.
    """
    refuse_lora("megatron_train", settings)
    try:
        import megatron.core  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "strategy_name=megatron_train needs megatron-core: pip install 'agentgym[megatron]'"
        ) from error
    from agentgym.trainers.strategies.megatron.strategy import MegatronStrategy

    return MegatronStrategy(model_path, **settings, **strategy_config)
