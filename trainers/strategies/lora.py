"""LoRA adapters with peft on the torch strategy: ROLL's ``model_args`` keys
(``lora_target``, ``lora_rank``, ``lora_alpha``), the frozen base as the reference,
the merged weights by base name, and the adapter's checkpoint.

The engines get merged weights (base + scaling · B·A), not the adapter: vLLM's LoRA
path wants each adapter registered and named in every request, and the transformers
backend has no adapter path; merged weights keep every backend working with the
same weight sync as full fine-tuning, one tensor at a time, the base names unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.choices import ALL_LINEAR, parse_lora_target

ADAPTER_DIR = "adapter"
"""The checkpoint folder of the adapter (peft's ``adapter_config.json`` and
``adapter_model.safetensors``)."""

ADAPTER_NAME = "default"


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter on the policy (ROLL's ``model_args``).

    Attributes:
        target: The adapted modules: names (the last part of a module's name, as
            peft matches them; ``all-linear`` for every linear layer but the output
            layer), or one regular expression matched against whole module names.
        rank: The adapter's rank ``r`` (``lora_rank``).
        alpha: The scale numerator: the update is ``alpha / rank · B·A``
            (``lora_alpha``; ROLL's default ``2 · rank`` is :func:`lora_settings`'s).
    """

    target: tuple[str, ...] | str
    rank: int
    alpha: int


def lora_settings(
    target: str | list[str] | None, rank: int, alpha: int | None
) -> LoraSettings | None:
    """The adapter of ROLL's ``model_args`` keys (None without ``lora_target``);
    ``alpha`` None is ROLL's default, ``2 · rank``.

    Raises:
        ValueError: As :func:`~agentgym.choices.parse_lora_target`.
    """
    if target is None:
        return None
    return LoraSettings(parse_lora_target(target), rank, alpha if alpha is not None else 2 * rank)


def refuse_lora(strategy_name: str, settings: dict[str, Any]) -> None:
    """Drop ``lora`` from a strategy's ``settings``; raise when it is set: LoRA is built
    on the torch strategy only.

    Raises:
        ValueError: On ``settings["lora"]`` set, naming what to use instead.
    """
    lora = settings.pop("lora", None)
    if lora is not None:
        raise ValueError(
            f"strategy_name={strategy_name!r} with lora_target={lora.target!r}: LoRA is "
            "built on the torch strategy only; set actor_train.strategy_args.strategy_name: "
            "torch (one process per device, data parallel over Ray ranks), or drop "
            "model_args.lora_target to fine-tune every weight"
        )


def target_modules(model: Any, target: tuple[str, ...] | str) -> list[str] | str:
    """peft's ``target_modules`` for ``model``: ``all-linear`` as the names of every
    ``torch.nn.Linear`` but the output layer (peft's rule), other names as they are.

    Raises:
        ValueError: When a named module is not in ``model`` (naming the linear ones).
    """
    if isinstance(target, str):
        return target
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = [
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    ]
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    names: list[str] = []
    for item in target:
        if item == ALL_LINEAR:
            names += linear
        elif item not in leaves:
            raise ValueError(
                f"lora_target names {item!r}, which this model does not have; its linear "
                f"layers: {sorted(set(linear))} (or {ALL_LINEAR!r})"
            )
        else:
            names.append(item)
    return sorted(set(names))


def add_adapter(model: Any, settings: LoraSettings) -> Any:
    """``model`` (a transformers causal LM) with a fresh LoRA adapter: peft's
    ``PeftModel``, only the adapter trainable (B starts at 0: the policy starts as
    the base). Half-precision adapters are kept in float32, as ROLL's (peft's
    ``autocast_adapter_dtype``).

    Raises:
        ValueError: On an adapter on a tied output layer (its merged weight would
            have to differ from the input embedding it shares).
    """
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=0.0,
        target_modules=target_modules(model, settings.target),
        task_type="CAUSAL_LM",
    )
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    adapted: Any = get_peft_model(model, config, adapter_name=ADAPTER_NAME)
    if tied and isinstance(adapted.get_base_model().get_output_embeddings(), LoraLayer):
        raise ValueError(
            f"lora_target={settings.target!r} adapts the output layer, which this model ties "
            "to its input embedding: a merged export cannot hold both; leave the output "
            f"layer out ({ALL_LINEAR!r} does)"
        )
    return adapted


class AdapterOff:
    """The base under ``model``'s adapter (peft's ``disable_adapter``): the frozen
    reference, with no second copy of the weights. Called like a model; each call
    runs in evaluation mode without gradient, the policy's mode kept."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, **inputs: Any) -> Any:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.model.disable_adapter():
                return self.model(**inputs)
        finally:
            self.model.train(was_training)


def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the base model by its Hugging Face name, each adapted weight
    merged (``W + alpha / rank · B·A``, as peft's ``merge_and_unload``), computed one
    at a time; the others are the live tensors."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted: dict[str, Any] = {
        name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)
    }
    for key, tensor in base.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if ".lora_" in f".{key}":
            continue
        if not owner.endswith(".base_layer"):
            yield key, tensor
            continue
        owner = owner.removesuffix(".base_layer")
        if leaf == "weight":
            delta = adapted[owner].get_delta_weight(ADAPTER_NAME).detach()
            tensor = (tensor + delta).to(tensor.dtype)  # as peft's in-place merge rounds
        yield f"{owner}.{leaf}", tensor


def save_adapter(model: Any, directory: Path) -> None:
    """Write the adapter as peft does (``adapter_config.json``,
    ``adapter_model.safetensors``; ``PeftModel.from_pretrained`` reads it)."""
    model.save_pretrained(str(directory), selected_adapters=[ADAPTER_NAME])


def load_adapter(model: Any, directory: Path) -> None:
    """Restore the adapter :func:`save_adapter` wrote into ``model``, in place.

    Raises:
        ValueError: When the saved adapter does not fit ``model``'s (other targets or rank).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(directory / "adapter_model.safetensors"))
    try:
        result: Any = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER_NAME)
    except RuntimeError as error:  # a tensor of another shape
        raise ValueError(f"{directory} holds another adapter: {error}") from None
    missing = [key for key in result.missing_keys if ".lora_" in key]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{directory} holds another adapter: missing {missing[:5]}, unexpected "
            f"{list(result.unexpected_keys)[:5]} (compare its adapter_config.json with "
            "lora_target and lora_rank)"
        )
