"""``agentgym plan``: the ranked table and the winner as ROLL's ``strategy_config``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agentgym.plan.auto import strategy_block
from agentgym.plan.memory import DTYPE_BYTES
from agentgym.plan.search import Devices, Plan, Workload, search
from agentgym.plan.shapes import SHAPES, load_shape


def roll_yaml(plan: Plan) -> str:
    """The winner as ROLL's ``actor_train`` keys (Megatron ``strategy_config``)."""
    lay = plan.layout
    lines = [
        "actor_train:",
        "  training_args:",
        f"    per_device_train_batch_size: {lay.micro_batch_size}",
        f"    gradient_accumulation_steps: {plan.gradient_accumulation_steps}",
        "  strategy_args:",
        "    strategy_name: megatron_train",
        "    strategy_config:",
    ]
    for key, value in strategy_block(plan).items():
        lines.append(f"      {key}: {str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"


def table(plans: Sequence[Plan], limit: int) -> str:
    """The first ``limit`` plans as aligned text, one row each with its reasons."""
    head = (
        f"{'#':>3} {'tp':>2} {'pp':>2} {'cp':>2} {'dp':>3} {'dopt':>4} {'recompute':>9} "
        f"{'mbs':>3} {'ga':>3} {'GiB':>6} {'s/step':>7}  why"
    )
    rows = [head]
    for rank, plan in enumerate(plans[:limit], 1):
        lay = plan.layout
        why = "; ".join(plan.refused) if plan.refused else "; ".join(plan.reasons)
        rows.append(
            f"{rank:>3} {lay.tp:>2} {lay.pp:>2} {lay.cp:>2} {lay.dp:>3} "
            f"{'on' if lay.distributed_optimizer else 'off':>4} {lay.recompute:>9} "
            f"{lay.micro_batch_size:>3} {plan.gradient_accumulation_steps:>3} "
            f"{plan.peak_gib:>6.1f} {plan.step_seconds:>7.2f}  {why}"
        )
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    """The command line of ``agentgym plan``."""
    p = argparse.ArgumentParser(
        prog="agentgym plan",
        description="Search Megatron layouts (TP/PP/CP/DP, distributed optimizer, recompute, "
        "micro-batch) for one RL step; print them ranked and the winner as ROLL's "
        "strategy_config. Formulas: docs/plan.md.",
    )
    p.add_argument(
        "--model",
        required=True,
        help=f"a Hugging Face folder, a config.json or one of {list(SHAPES)}",
    )
    p.add_argument("--devices", type=int, required=True, help="training devices")
    p.add_argument("--memory-gib", type=float, default=80.0, help="memory per device")
    p.add_argument("--per-node", type=int, default=8, help="devices per node")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sample")
    p.add_argument(
        "--prompt-len",
        type=int,
        default=0,
        help="tokens before the first scored one in every sample (the shortest first "
        "prompt): the LM head skips them (default 0: counted on every position)",
    )
    p.add_argument("--rollout-batch-size", type=int, required=True, help="prompts per step")
    p.add_argument("--num-return-sequences", type=int, default=1, help="samples per prompt")
    p.add_argument(
        "--mini-batch-size",
        type=int,
        default=None,
        help="samples per optimizer step (default: the whole rollout)",
    )
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="bfloat16")
    p.add_argument(
        "--colocate",
        action="store_true",
        help="the engines share the training devices (weights and KV cache resident)",
    )
    p.add_argument("--infer-tp", type=int, default=1, help="the engines' tensor parallel size")
    p.add_argument(
        "--peak-tflops", type=float, default=989.0, help="dense bf16 peak per device (H100 SXM 989)"
    )
    p.add_argument(
        "--efficiency",
        type=float,
        default=0.4,
        help="the fraction of the peak a step reaches (stated, not measured)",
    )
    p.add_argument(
        "--layer-pass-ms",
        type=float,
        default=2.85,
        help="milliseconds each layer adds per micro-batch beyond its FLOPs (fit on an H100)",
    )
    p.add_argument(
        "--reserve-gib",
        type=float,
        default=4.0,
        help="memory kept back per device (context, NCCL, fragmentation)",
    )
    p.add_argument(
        "--transformer-engine",
        action="store_true",
        help="plan for Megatron-LM with Transformer Engine (ROLL's runs): sequence parallelism "
        "beside TP and context parallelism; agentgym's Megatron strategy has neither",
    )
    p.add_argument("--top", type=int, default=10, help="rows of the table")
    p.add_argument("--refused", action="store_true", help="list the refused layouts too")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``agentgym plan``; exits 1 when no layout fits."""
    args = parser().parse_args(argv)
    try:
        shape = load_shape(args.model)
    except ValueError as error:
        parser().error(str(error))
    devices = Devices(
        args.devices,
        args.memory_gib,
        args.per_node,
        args.peak_tflops,
        args.efficiency,
        reserve_gib=args.reserve_gib,
        layer_pass_seconds=args.layer_pass_ms / 1000,
    )
    try:
        work = Workload(
            args.seq_len,
            args.rollout_batch_size,
            args.num_return_sequences,
            args.mini_batch_size,
            args.dtype,
            args.colocate,
            args.infer_tp,
            args.prompt_len,
            split_sequence=args.transformer_engine,
        )
    except ValueError as error:
        parser().error(str(error))
    plans = search(shape, devices, work)
    kept = [plan for plan in plans if not plan.refused]
    refused = [plan for plan in plans if plan.refused]
    print(
        f"{shape.name}: {len(plans)} layouts on {devices.count} × {devices.memory_gib:g} GiB, "
        f"{len(kept)} kept, {len(refused)} refused (efficiency {devices.efficiency:.0%} of "
        f"{devices.peak_tflops:g} TFLOP/s)"
    )
    if kept:
        print(table(kept, args.top))
    if refused and (args.refused or not kept):
        print("\nrefused:")
        print(table(refused, args.top))
    if not kept:
        print("\nno layout fits: add devices, shorten seq-len or the mini-batch", file=sys.stderr)
        sys.exit(1)
    print("\n# the winner, as ROLL's keys")
    print(roll_yaml(kept[0]), end="")
