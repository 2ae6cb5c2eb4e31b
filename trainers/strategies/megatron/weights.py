"""Hugging Face ↔ Megatron weights: one declarative table, split by TP, placed by PP.

Each :class:`Rule` names a megatron-core (local spec) parameter, the Hugging
Face tensors it is made of, and its :data:`LAYOUTS` entry: how the Hugging Face
tensors stack into the full Megatron tensor and how that splits over the
tensor-parallel ranks. The names agree with mbridge's ``Qwen2Bridge`` (which
targets Transformer Engine's fused-norm names: there ``input_layernorm`` is
``linear_qkv.layer_norm_weight`` and ``pre_mlp_layernorm`` is
``linear_fc1.layer_norm_weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Rule:
    """One Megatron parameter.

    Attributes:
        megatron: Name under the ``GPTModel``; ``{layer}`` is the global layer index.
        hf: The Hugging Face tensors it is made of, in stacking order.
        layout: A key of :data:`LAYOUTS`.
    """

    megatron: str
    hf: tuple[str, ...]
    layout: str


@dataclass(frozen=True)
class Shapes:
    """What the layouts need to know about the model."""

    vocab_size: int
    padded_vocab_size: int
    num_query_groups: int
    heads_per_group: int
    head_dim: int


def _qkv_stack(parts: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    # q [G*Q*D, ...], k [G*D, ...], v [G*D, ...] -> [G, (Q+2)*D, ...] -> [G*(Q+2)*D, ...]
    groups, per, dim = shapes.num_query_groups, shapes.heads_per_group, shapes.head_dim
    q, k, v = parts
    tail = q.shape[1:]
    stacked = torch.cat(
        [
            q.reshape(groups, per * dim, *tail),
            k.reshape(groups, dim, *tail),
            v.reshape(groups, dim, *tail),
        ],
        1,
    )
    return stacked.reshape(groups * (per + 2) * dim, *tail)


def _qkv_unstack(full: torch.Tensor, shapes: Shapes) -> list[torch.Tensor]:
    groups, per, dim = shapes.num_query_groups, shapes.heads_per_group, shapes.head_dim
    tail = full.shape[1:]
    grouped = full.reshape(groups, (per + 2) * dim, *tail)  # [G, (Q+2)*D, ...]
    q, k, v = grouped.split([per * dim, dim, dim], 1)
    return [part.reshape(-1, *tail) for part in (q, k, v)]


def _vocab_pad(parts: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    (table,) = parts  # [V, H] -> [V_padded, H] (zero rows)
    extra = shapes.padded_vocab_size - table.shape[0]
    return torch.cat([table, table.new_zeros(extra, *table.shape[1:])]) if extra else table


@dataclass(frozen=True)
class Layout:
    """How Hugging Face tensors become one Megatron tensor, and how it splits over TP.

    Attributes:
        stack: HF tensors -> the full (unsplit) Megatron tensor.
        unstack: The full Megatron tensor -> the HF tensors.
        split_dim: Dimension split over the TP ranks (None: replicated).
        interleave: Pieces inside the full tensor that each split separately
            (``linear_fc1`` = [gate; up]: each rank holds [gate_r; up_r]).
    """

    stack: Callable[[list[torch.Tensor], Shapes], torch.Tensor]
    unstack: Callable[[torch.Tensor, Shapes], list[torch.Tensor]]
    split_dim: int | None
    interleave: int = 1


def _one(parts: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    return parts[0]


def _cat(parts: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    return torch.cat(parts)


LAYOUTS: dict[str, Layout] = {
    "replicated": Layout(_one, lambda full, s: [full], None),
    "column": Layout(_one, lambda full, s: [full], 0),
    "row": Layout(_one, lambda full, s: [full], 1),
    "vocab": Layout(_vocab_pad, lambda full, s: [full[: s.vocab_size]], 0),
    "qkv": Layout(_qkv_stack, _qkv_unstack, 0),  # whole query groups per TP rank
    "gate_up": Layout(_cat, lambda full, s: list(full.chunk(2)), 0, interleave=2),
}
"""Layout name -> :class:`Layout`."""

_LAYER = "model.layers.{layer}."
LAYER_RULES = (
    Rule("input_layernorm.weight", (_LAYER + "input_layernorm.weight",), "replicated"),
    Rule(
        "self_attention.linear_qkv.weight",
        tuple(_LAYER + f"self_attn.{p}_proj.weight" for p in "qkv"),
        "qkv",
    ),
    Rule(
        "self_attention.linear_qkv.bias",
        tuple(_LAYER + f"self_attn.{p}_proj.bias" for p in "qkv"),
        "qkv",
    ),
    Rule("self_attention.q_layernorm.weight", (_LAYER + "self_attn.q_norm.weight",), "replicated"),
    Rule("self_attention.k_layernorm.weight", (_LAYER + "self_attn.k_norm.weight",), "replicated"),
    Rule("self_attention.linear_proj.weight", (_LAYER + "self_attn.o_proj.weight",), "row"),
    Rule("pre_mlp_layernorm.weight", (_LAYER + "post_attention_layernorm.weight",), "replicated"),
    Rule(
        "mlp.linear_fc1.weight",
        (_LAYER + "mlp.gate_proj.weight", _LAYER + "mlp.up_proj.weight"),
        "gate_up",
    ),
    Rule("mlp.linear_fc2.weight", (_LAYER + "mlp.down_proj.weight",), "row"),
)
"""Per-layer rules; Megatron names are under ``decoder.layers.{local index}.``."""

MODEL_RULES = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"),
    Rule("output_layer.weight", ("lm_head.weight",), "vocab"),
)
"""Rules outside the layers."""


def tp_shard(full: torch.Tensor, layout: Layout, rank: int, size: int) -> torch.Tensor:
    """TP rank ``rank``'s shard of the full Megatron tensor."""
    if layout.split_dim is None or size == 1:
        return full
    pieces = full.chunk(layout.interleave, layout.split_dim)
    return torch.cat(
        [piece.chunk(size, layout.split_dim)[rank] for piece in pieces], layout.split_dim
    )


def tp_merge(shards: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    """The full Megatron tensor from every TP rank's shard (inverse of :func:`tp_shard`)."""
    if layout.split_dim is None or len(shards) == 1:
        return shards[0]
    dim = layout.split_dim
    split = [shard.chunk(layout.interleave, dim) for shard in shards]
    return torch.cat(
        [torch.cat([parts[i] for parts in split], dim) for i in range(layout.interleave)], dim
    )


def local_rules(model: torch.nn.Module) -> Iterator[tuple[str, Rule, int | None]]:
    """``(local Megatron name, rule, global layer)`` for each parameter of this PP stage.

    Raises:
        KeyError: On a parameter no rule covers.
    """
    layer_rules = {rule.megatron: rule for rule in LAYER_RULES}
    model_rules = {rule.megatron: rule for rule in MODEL_RULES}
    layers = [layer.layer_number - 1 for layer in model.decoder.layers]  # type: ignore[union-attr]
    for name, _ in model.named_parameters():
        if name.startswith("decoder.layers."):
            index, suffix = name[len("decoder.layers.") :].split(".", 1)
            if suffix not in layer_rules:
                raise KeyError(f"no Hugging Face rule for Megatron parameter {name!r}")
            yield name, layer_rules[suffix], layers[int(index)]
        elif name in model_rules:
            yield name, model_rules[name], None
        else:
            raise KeyError(f"no Hugging Face rule for Megatron parameter {name!r}")


def hf_names(rule: Rule, layer: int | None, tied: bool) -> tuple[str, ...]:
    """The Hugging Face names of ``rule`` (tied models read the output layer from
    the embedding)."""
    if tied and rule.megatron == "output_layer.weight":
        return ("model.embed_tokens.weight",)
    return tuple(name.format(layer=layer) for name in rule.hf)


@torch.no_grad()
def load_hf_weights(
    model: torch.nn.Module,
    hf_state: Mapping[str, torch.Tensor],
    shapes: Shapes,
    *,
    tp_rank: int,
    tp_size: int,
    tied: bool,
) -> None:
    """Copy this rank's shards of ``hf_state`` into ``model`` (one PP stage)."""
    params = dict(model.named_parameters())
    for name, rule, layer in local_rules(model):
        layout = LAYOUTS[rule.layout]
        parts = [hf_state[hf].to(torch.float32) for hf in hf_names(rule, layer, tied)]
        shard = tp_shard(layout.stack(parts, shapes), layout, tp_rank, tp_size)
        param = params[name]
        if shard.shape != param.shape:
            raise ValueError(
                f"{name}: the Hugging Face weights give {tuple(shard.shape)}, the model has "
                f"{tuple(param.shape)}; is the config the folder's own?"
            )
        param.copy_(shard)


def hf_tensors(
    rule: Rule, layer: int | None, full: torch.Tensor, shapes: Shapes, tied: bool
) -> list[tuple[str, torch.Tensor]]:
    """The Hugging Face ``(name, tensor)`` pairs of one full Megatron tensor."""
    if tied and rule.megatron == "output_layer.weight":
        return []  # the embedding already gave model.embed_tokens.weight
    names = hf_names(rule, layer, tied)
    return list(zip(names, LAYOUTS[rule.layout].unstack(full, shapes), strict=True))


def shapes_of(hf_config: Any, padded_vocab_size: int) -> Shapes:
    """:class:`Shapes` of a Hugging Face config."""
    heads, groups = hf_config.num_attention_heads, hf_config.num_key_value_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return Shapes(hf_config.vocab_size, padded_vocab_size, groups, heads // groups, head_dim)
