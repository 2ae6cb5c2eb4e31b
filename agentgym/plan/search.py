"""Enumerate Megatron layouts, estimate each one's memory and step time, refuse the
ones that do not fit or break ROLL's batch rule, and rank the rest."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentgym.plan.memory import (
    DTYPE_BYTES,
    RECOMPUTE,
    Layout,
    activation_bytes,
    state_bytes,
    total_parameters,
)
from agentgym.plan.shapes import ModelShape

GIB = 1024**3


@dataclass(frozen=True)
class Devices:
    """The training devices.

    Attributes:
        count: Devices the trainer uses.
        memory_gib: Memory per device.
        per_node: Devices per node (TP and CP stay inside one).
        peak_tflops: Dense bf16 peak per device (H100 SXM: 989).
        efficiency: The fraction of the peak a step's matmuls reach (stated, not measured).
        intra_node_gbps: Bus bandwidth of a collective inside a node, GB/s (NVLink).
        inter_node_gbps: Bus bandwidth across nodes, GB/s per device (InfiniBand).
        reserve_gib: Memory kept back per device (CUDA context, NCCL buffers, fragmentation).
        layer_pass_seconds: Seconds each layer of a stage adds per micro-batch on top of
            its FLOPs (kernel launches, matmuls too small to fill the device): fewer,
            larger micro-batches are faster. Fit to the lent H100's Megatron steps of the
            1.5B shape (64 × 1024 tokens, TP=1): MFU 13.3% at micro-batch 1, 31.4% at 4.
    """

    count: int
    memory_gib: float
    per_node: int = 8
    peak_tflops: float = 989.0
    efficiency: float = 0.4
    intra_node_gbps: float = 360.0
    inter_node_gbps: float = 40.0
    reserve_gib: float = 4.0
    layer_pass_seconds: float = 2.85e-3


@dataclass(frozen=True)
class Workload:
    """One RL step's training work.

    Attributes:
        seq_len: Tokens per sample (prompt and response, padded).
        rollout_batch_size: Prompts per step (ROLL's ``rollout_batch_size``).
        num_return_sequences: Samples per prompt.
        mini_batch_size: Samples per optimizer step (ROLL's ``per_device_train_batch_size
            × gradient_accumulation_steps × DP``); None: the whole rollout, one step.
        dtype: Parameter dtype.
        colocated: Whether the inference engines share the training devices (their weights
            and the rollout's KV cache stay resident: no sleep or offload assumed).
        infer_tp: The engines' tensor parallel size.
        prompt_len: Tokens before the first scored one in every sample (the shortest
            first prompt): the LM head skips them. 0 counts the head on every position.
        split_sequence: Whether the trainer can split the sequence: sequence parallelism
            beside TP, and context parallelism. Megatron-LM with Transformer Engine can
            (ROLL's runs); this project's Megatron strategy builds megatron-core's local
            layer spec, which cannot, so the default plans TP without SP and no CP.
    """

    seq_len: int
    rollout_batch_size: int
    num_return_sequences: int = 1
    mini_batch_size: int | None = None
    dtype: str = "bfloat16"
    colocated: bool = False
    infer_tp: int = 1
    prompt_len: int = 0
    split_sequence: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.prompt_len < self.seq_len:
            raise ValueError(
                f"prompt_len={self.prompt_len} must be at least 0 and below "
                f"seq_len={self.seq_len}: a sample needs a scored token"
            )

    @property
    def samples(self) -> int:
        """Samples trained on per step."""
        return self.rollout_batch_size * self.num_return_sequences


@dataclass
class Plan:
    """One evaluated layout: its memory, time, and why it is kept or refused."""

    layout: Layout
    gradient_accumulation_steps: int
    memory: dict[str, float]
    seconds: dict[str, float]
    refused: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def peak_gib(self) -> float:
        """The worst device's total, GiB."""
        return self.memory["total"] / GIB

    @property
    def step_seconds(self) -> float:
        """Estimated seconds of one RL step's training."""
        return self.seconds["total"]


def roll_batch_rule(samples: int, micro_batch_size: int, accumulation: int, dp: int) -> str | None:
    """ROLL's rule, or None when it holds.

    ROLL deals the rollout's ``rollout_batch_size × num_return_sequences`` samples over the
    DP ranks (``DataProto.chunk``) and each rank iterates them in backward batches of
    ``per_device_train_batch_size × gradient_accumulation_steps``, asserting the batch
    divides evenly (``DataProto.make_iterator``; roll/pipeline/base_worker.py, train_step).
    """
    minibatch = micro_batch_size * accumulation * dp
    if samples % minibatch:
        return (
            f"ROLL's batch rule: {samples} samples not divisible by per_device_train_batch_size "
            f"× gradient_accumulation_steps × dp = {micro_batch_size}×{accumulation}×{dp}"
        )
    return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def engine_bytes(shape: ModelShape, devices: Devices, work: Workload) -> float:
    """A colocated engine's weights (bf16, split over ``infer_tp``) and the KV cache of
    this device's share of the rollout (2 × L × kv_heads × head_dim × 2 bytes a token)."""
    weights = total_parameters(shape) * 2 / work.infer_tp
    samples = -(-work.samples // devices.count)
    kv = samples * work.seq_len * 2 * shape.num_layers * shape.kv_size * 2 / work.infer_tp
    return weights + kv


def step_seconds(
    shape: ModelShape, layout: Layout, devices: Devices, work: Workload, accumulation: int
) -> dict[str, float]:
    """Compute, per-micro-batch overhead, pipeline bubble and communication seconds of
    one RL step (no overlap).

    FLOPs: 6 × parameters + 6 × L × q_size × seq (causal attention) a token (the Ultra-Scale
    Playbook, "Memory usage"/"Compute"; Korthikanti et al. 2022, Appendix), one more forward
    with full recomputation (8 instead of 6 on everything), the attention forward again
    with selective.
    """
    tokens = work.samples * work.seq_len
    dense = 2 * total_parameters(shape)
    attention = 2 * shape.num_layers * shape.q_size * work.seq_len
    passes = {"none": (3, 3), "selective": (3, 4), "full": (4, 4)}[layout.recompute]
    flops = tokens * (passes[0] * dense + passes[1] * attention)
    compute = flops / (devices.count * devices.peak_tflops * 1e12 * devices.efficiency)
    bubble = compute * (layout.pp - 1) / accumulation
    element = DTYPE_BYTES[work.dtype]
    intra, inter = devices.intra_node_gbps * 1e9, devices.inter_node_gbps * 1e9
    micro_batches = work.samples // (layout.micro_batch_size * layout.dp)
    activation = layout.micro_batch_size * work.seq_len / layout.cp * shape.hidden_size * element
    layers = shape.num_layers // layout.pp
    # TP: 2 all-reduces forward and 2 backward per layer (one more forward's 2 with full
    # recomputation), each moving 2 (t - 1)/t of the activation.
    tp_calls = 4 + (2 if layout.recompute == "full" else 0)
    tp = micro_batches * layers * tp_calls * 2 * (layout.tp - 1) / layout.tp * activation / intra
    # PP: one activation forward and one gradient backward per micro-batch and boundary.
    pp_link = intra if layout.world <= devices.per_node else inter
    pp = micro_batches * 2 * activation / layout.tp * (1 if layout.pp > 1 else 0) / pp_link
    # CP: k and v all-gathered forward, their gradients reduce-scattered backward.
    kv = layout.micro_batch_size * work.seq_len * 2 * shape.kv_size / layout.tp * element
    cp = micro_batches * layers * 2 * (layout.cp - 1) / layout.cp * kv / intra
    # DP: a ring all-reduce of the fp32 gradients (2 (d-1)/d), or with the distributed
    # optimizer a reduce-scatter of them and an all-gather of the weights, each optimizer step.
    grads = state_bytes(shape, layout, dtype=work.dtype).gradients
    weights = state_bytes(shape, layout, dtype=work.dtype).weights
    moved = (grads + weights) if layout.distributed_optimizer else 2 * grads
    dp_link = intra if layout.world <= devices.per_node else inter
    steps = work.samples // (layout.micro_batch_size * accumulation * layout.dp)
    dp = steps * (layout.dp * layout.cp - 1) / (layout.dp * layout.cp) * moved / dp_link
    # each micro-batch's fixed cost on each layer of a stage, forward and backward passes
    overhead = micro_batches * layers * devices.layer_pass_seconds * (passes[0] / 3)
    total = compute + bubble + tp + pp + cp + dp + overhead
    return {
        "compute": compute,
        "overhead": overhead,
        "bubble": bubble,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": dp,
        "total": total,
    }


def evaluate(
    shape: ModelShape, layout: Layout, devices: Devices, work: Workload, accumulation: int
) -> Plan:
    """Memory (worst pipeline stage) and time of ``layout``, with its refusals."""
    stages = []
    for stage in range(layout.pp):
        states = state_bytes(shape, layout, dtype=work.dtype, stage=stage)
        acts = activation_bytes(
            shape,
            layout,
            work.seq_len,
            dtype=work.dtype,
            micro_batches=accumulation,
            stage=stage,
            prompt_len=work.prompt_len,
        )
        stages.append(
            {
                "weights": states.weights,
                "gradients": states.gradients,
                "optimizer": states.optimizer,
                "activations": acts,
            }
        )
    worst = max(stages, key=lambda s: sum(s.values()))
    worst["engines"] = engine_bytes(shape, devices, work) if work.colocated else 0.0
    worst["total"] = sum(worst.values())
    plan = Plan(
        layout, accumulation, worst, step_seconds(shape, layout, devices, work, accumulation)
    )
    capacity = (devices.memory_gib - devices.reserve_gib) * GIB
    if worst["total"] > capacity:
        plan.refused.append(
            f"memory: {worst['total'] / GIB:.1f} GiB > {capacity / GIB:.1f} GiB usable"
        )
    rule = roll_batch_rule(work.samples, layout.micro_batch_size, accumulation, layout.dp)
    if rule:
        plan.refused.append(rule)
    return plan


def layouts(shape: ModelShape, devices: Devices, work: Workload) -> list[tuple[Layout, int]]:
    """Every layout and gradient accumulation the devices and the model allow.

    TP divides the query and kv heads and stays inside a node with CP; PP divides the
    layers; CP halves of the sequence split evenly (Megatron's load-balanced CP needs
    ``seq % (2 cp) == 0``); the mini-batch splits into DP × micro-batch × accumulation.
    SP beside TP and CP > 1 only where ``work.split_sequence``.
    """
    minibatch = work.mini_batch_size or work.samples
    found = []
    for tp in _divisors(devices.per_node):
        if shape.num_heads % tp or shape.num_kv_heads % tp:
            continue
        for cp in _divisors(devices.per_node // tp):
            if cp > 1 and (work.seq_len % (2 * cp) or not work.split_sequence):
                continue
            for pp in _divisors(shape.num_layers):
                if devices.count % (tp * cp * pp):
                    continue
                dp = devices.count // (tp * cp * pp)
                if minibatch % dp:
                    continue
                per_replica = minibatch // dp
                for mbs in _powers_of_two(per_replica):
                    if per_replica % mbs:
                        continue
                    for dist_opt in (False, True) if dp * cp > 1 else (False,):
                        for recompute in RECOMPUTE:
                            sp = tp > 1 and work.split_sequence
                            layout = Layout(tp, pp, cp, dp, dist_opt, recompute, mbs, sp)
                            found.append((layout, per_replica // mbs))
    return found


def explain(plan: Plan, shape: ModelShape) -> None:
    """Fill ``plan.reasons``: why each size was chosen, in the table's words."""
    lay, mem, sec = plan.layout, plan.memory, plan.seconds
    gib = {k: v / GIB for k, v in mem.items()}
    reasons = []
    if lay.tp > 1:
        split = "weights and activations (SP on)" if lay.sequence_parallel else "weights"
        reasons.append(f"tp={lay.tp} inside a node splits {split}, {sec['tp']:.2f} s of all-reduce")
    if lay.pp > 1:
        reasons.append(
            f"pp={lay.pp}: {shape.num_layers // lay.pp} layers a stage, "
            f"bubble {sec['bubble']:.2f} s at {plan.gradient_accumulation_steps} "
            "micro-batches"
        )
    if lay.cp > 1:
        reasons.append(f"cp={lay.cp} splits the sequence's activations")
    if lay.dp > 1:
        reasons.append(f"dp={lay.dp}: gradients {sec['dp']:.2f} s a step")
    if lay.distributed_optimizer:
        reasons.append(
            f"distributed optimizer: optimizer state {gib['optimizer']:.1f} GiB "
            f"(1/{lay.dp * lay.cp})"
        )
    reasons.append(f"recompute {lay.recompute}: activations {gib['activations']:.1f} GiB")
    if mem["engines"]:
        reasons.append(f"engines {gib['engines']:.1f} GiB")
    plan.reasons = reasons


def search(shape: ModelShape, devices: Devices, work: Workload) -> list[Plan]:
    """Every layout, evaluated: the kept ones first, fastest first (less memory on a tie),
    then the refused ones, closest to fitting first."""
    plans = [evaluate(shape, lay, devices, work, ga) for lay, ga in layouts(shape, devices, work)]
    for plan in plans:
        explain(plan, shape)
    return sorted(
        plans,
        key=lambda p: (
            (bool(p.refused), p.step_seconds, p.peak_gib)
            if not p.refused
            else (True, p.peak_gib, p.step_seconds)
        ),
    )
