"""Per-device memory of a training layout: weights, gradients, optimizer state, activations.

The formulas and their sources are in ``docs/plan.md``: the parameter counts follow
Megatron-LM's ``theoretical_memory_usage.py`` (with this repository's vocabulary
padding and GQA/SwiGLU/qkv-bias terms), the bytes per parameter follow what the
Megatron and torch strategies allocate, and the activation counts follow
Korthikanti et al. 2022 (Table 2), recounted for this architecture: RMSNorm,
grouped-query attention with a flash (no ``s × s`` matrix) kernel, SwiGLU, no dropout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentgym.plan.shapes import ModelShape

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each parameter dtype."""

RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation choices (ROLL's ``recompute_granularity``: unset, selective, full)."""


@dataclass(frozen=True)
class Layout:
    """One training layout: the parallel sizes and the per-device batch.

    Attributes:
        tp, pp, cp, dp: Tensor, pipeline, context and data parallel sizes.
        distributed_optimizer: Megatron's ZeRO-1: optimizer state split over DP × CP.
        recompute: One of :data:`RECOMPUTE`.
        micro_batch_size: Sequences per forward pass (ROLL's ``per_device_train_batch_size``).
        sequence_parallel: Norms and dropout regions split over TP too (Megatron's SP).
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    dp: int = 1
    distributed_optimizer: bool = False
    recompute: str = "none"
    micro_batch_size: int = 1
    sequence_parallel: bool = False

    @property
    def world(self) -> int:
        """Devices the layout occupies."""
        return self.tp * self.pp * self.cp * self.dp


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each kind of state a strategy keeps."""

    weight: int
    grad: int
    optimizer: int


def _megatron_precision(dtype: str) -> Precision:
    # The Megatron strategy reduces gradients in fp32 (grad_reduce_in_fp32=True); Adam's
    # two moments are fp32, plus an fp32 main copy of each half-precision weight.
    weight = DTYPE_BYTES[dtype]
    return Precision(weight, 4, 8 if weight == 4 else 12)


def _torch_precision(dtype: str) -> Precision:
    # torch.optim.AdamW keeps its moments in the parameter's dtype, no main copy.
    weight = DTYPE_BYTES[dtype]
    return Precision(weight, weight, 2 * weight)


PRECISIONS: dict[str, Callable[[str], Precision]] = {
    "megatron": _megatron_precision,
    "torch": _torch_precision,
}
"""Strategy name -> its bytes per parameter for a parameter dtype."""


@dataclass(frozen=True)
class StateBytes:
    """One device's bytes of weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """All three together."""
        return self.weights + self.gradients + self.optimizer


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The Megatron strategy's embedding rows: ``vocab_size`` rounded up to a multiple of TP."""
    return -(-vocab_size // tp) * tp


def layer_parameters(shape: ModelShape, tp: int = 1) -> int:
    """Parameters of one transformer layer on one TP rank.

    q, k, v, the output projection and the three SwiGLU matrices are split over TP;
    the two RMSNorms (and Qwen3's q/k norms) are replicated.
    """
    h, q, kv, f = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size
    split = h * (q + 2 * kv) + q * h + 3 * h * f + (q + 2 * kv if shape.qkv_bias else 0)
    replicated = 2 * h + (2 * shape.head_dim if shape.qk_norm else 0)
    return split // tp + replicated


def stage_parameters(shape: ModelShape, tp: int = 1, pp: int = 1, stage: int = 0) -> int:
    """Parameters held by one rank of pipeline stage ``stage``.

    The first stage holds the embedding, the last the final norm and the output layer;
    a tied output layer is the embedding itself when one stage holds both, and a copy
    on the last stage otherwise (Megatron keeps the two in sync by an all-reduce).
    """
    h = shape.hidden_size
    embedding = padded_vocab_size(shape.vocab_size, tp) * h // tp
    count = shape.num_layers // pp * layer_parameters(shape, tp)
    if stage == 0:
        count += embedding
    if stage == pp - 1:
        count += h + (embedding if not shape.tied or pp > 1 else 0)
    return count


def total_parameters(shape: ModelShape) -> int:
    """The model's parameters, as the Hugging Face checkpoint counts them."""
    return stage_parameters(shape)


def state_bytes(
    shape: ModelShape,
    layout: Layout,
    *,
    strategy: str = "megatron",
    dtype: str = "bfloat16",
    stage: int = 0,
) -> StateBytes:
    """Weights, gradients and optimizer state of one rank of pipeline stage ``stage``."""
    params = stage_parameters(shape, layout.tp, layout.pp, stage)
    bytes_per = PRECISIONS[strategy](dtype)
    shards = layout.dp * layout.cp if layout.distributed_optimizer else 1
    return StateBytes(
        params * bytes_per.weight, params * bytes_per.grad, params * bytes_per.optimizer / shards
    )


def layer_activation_elements(shape: ModelShape, layout: Layout) -> dict[str, float]:
    """Elements one transformer layer keeps for backward, per token of the micro-batch.

    Counted per autograd-saved tensor (Korthikanti et al. 2022, section 4.1, recounted for
    this architecture): each RMSNorm keeps its input, the normalized input and its output
    (the next linear's input), 3h; flash attention keeps q, k, v, its output (the output
    projection's input) and a log-sum-exp per head, 2q + 2kv + heads; SwiGLU keeps the
    gate, silu(gate), up and the down projection's input, 4f. Tensor parallelism splits
    the attention and MLP terms; sequence parallelism splits the norms too.

    Returns:
        ``norms``, ``attention``, ``mlp``, ``all``, ``stored`` (what the recomputation
        keeps: everything for none, all but the log-sum-exp for selective, the layer
        input for full) and ``backward`` (the gradients that pass through the layer's
        SwiGLU in its backward pass at once: the down projection's input, silu(gate)
        and up, then the gate's and the fused gate/up output's, 4f).
    """
    h, t = shape.hidden_size, layout.tp
    sp = t if layout.sequence_parallel else 1
    norms = 2 * 3 * h / sp
    attention = (2 * shape.q_size + 2 * shape.kv_size + shape.num_heads) / t
    mlp = 4 * shape.intermediate_size / t
    full = norms + attention + mlp
    stored = {
        "none": full,
        "selective": full - shape.num_heads / t,
        "full": h / sp,
    }[layout.recompute]
    return {
        "norms": norms,
        "attention": attention,
        "mlp": mlp,
        "all": full,
        "stored": stored,
        "backward": mlp,
    }


def head_activation_bytes(
    shape: ModelShape, layout: Layout, dtype: str, logit_share: float = 1.0
) -> float:
    """Bytes per token the last stage holds at its peak after the layers: the final norm
    (3h), the logits in the parameter dtype and the one fp32 softmax over the (TP-split)
    vocabulary the log-probabilities are computed in (in the backward pass: that softmax
    turned gradient, and the logits' gradient), these two on the ``logit_share`` of the
    positions the head runs on."""
    sp = layout.tp if layout.sequence_parallel else 1
    vocab = padded_vocab_size(shape.vocab_size, layout.tp) / layout.tp
    norm = 3 * shape.hidden_size / sp * DTYPE_BYTES[dtype]
    return norm + logit_share * (DTYPE_BYTES[dtype] + 4) * vocab


def logit_share(layout: Layout, seq_len: int, prompt_len: int) -> float:
    """The share of a sample's positions the LM head runs on: from the one before the
    first scored token on (every strategy skips the prompt before it), or all of them
    where the hidden states reach the head split along the sequence (sequence or context
    parallelism)."""
    if layout.sequence_parallel or layout.cp > 1 or prompt_len <= 1:
        return 1.0
    return (seq_len - min(prompt_len, seq_len) + 1) / seq_len


def activation_bytes(
    shape: ModelShape,
    layout: Layout,
    seq_len: int,
    *,
    dtype: str = "bfloat16",
    micro_batches: int = 1,
    stage: int = 0,
    prompt_len: int = 0,
) -> float:
    """Peak activation bytes on one rank of pipeline stage ``stage``, the samples'
    first ``prompt_len`` tokens scored by no loss (:func:`logit_share`).

    Under 1F1B, stage ``s`` holds ``min(pp - s, micro_batches)`` micro-batches in flight
    (Korthikanti et al. 2022, section 4.2.3). With no or selective recomputation the peak
    is at the end of the last forward; with full recomputation it is the stored layer
    inputs plus one layer recomputed in backward with the gradients passing through it,
    or the head if that is larger (the head's activations are freed before the first
    layer is recomputed).
    """
    tokens = layout.micro_batch_size * seq_len / layout.cp
    element = DTYPE_BYTES[dtype]
    per_layer = layer_activation_elements(shape, layout)
    layers = shape.num_layers // layout.pp
    in_flight = min(layout.pp - stage, micro_batches)
    # Input ids (int64) and the rotary cos/sin tables (fp32), once per micro-batch.
    inputs = 8 + 2 * shape.head_dim * 4
    stored = in_flight * (layers * per_layer["stored"] * element + inputs)
    share = logit_share(layout, seq_len, prompt_len)
    head = head_activation_bytes(shape, layout, dtype, share) if stage == layout.pp - 1 else 0.0
    if layout.recompute == "full":
        recomputed = (per_layer["all"] + per_layer["backward"]) * element
        return tokens * (stored + max(head, recomputed))
    return tokens * (stored + head)
