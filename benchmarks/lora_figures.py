"""LoRA against full fine-tuning on the same model: trainable parameters and peak memory.

    python benchmarks/lora_figures.py [--layers 6] [--steps 2] [--json out.json]

Each setting runs in a fresh process (peak RSS is a process's high-water mark): the
torch strategy on the CPU in float32 with its reference (the KL term's; LoRA's is the
base under the adapter, full fine-tuning loads a second copy), then ``--steps`` policy
updates of 8 rows × 256 tokens in micro-batches of 2. Models: the tests' tiny model,
and a Qwen2.5-0.5B-shaped model (width 896, vocabulary 151,936, tied embedding) with
``--layers`` of its 24 layers and random weights. LoRA: ``all-linear``, rank 8, alpha
16. Memory: the peak RSS minus the RSS after the imports and a first backward pass
(the model, the reference, gradients, AdamW's two moments and the activations).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tables import print_table

SHAPES = ("tiny", "qwen2.5-0.5b-shaped")
MODES = ("full", "lora")
ROWS, WIDTH = 8, 256


def _status_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (this process's peak; unlike ``ru_maxrss`` it does
    not carry the parent's peak over ``exec``) of ``/proc/self/status``, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(model_dir: Path, mode: str, steps: int) -> dict[str, Any]:
    """One setting, in this process: trainable parameters, optimizer-state and peak memory."""
    import torch

    # imported here, as torch is: the parent process that only starts the settings skips them
    from gpu.training import random_batch

    from agentgym.builders.recipe import default_grpo_config
    from agentgym.trainers.strategies.lora import LoraSettings
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy
    from agentgym.trainers.updates import update_policy

    torch.set_num_threads(1)
    config = default_grpo_config(micro_batch_size=2, gradient_accumulation_steps=4)
    batch = random_batch(ROWS, WIDTH, min(1000, _vocab(model_dir)), "cpu")
    batch.ref_logprobs = batch.old_logprobs  # the KL term's reference
    _warm_up()
    before = _status_mib("VmRSS")
    lora = LoraSettings(("all-linear",), 8, 16) if mode == "lora" else None
    strategy = TorchStrategy(model_dir, micro_batch_size=2, reference_path=model_dir, lora=lora)
    for step in range(1, steps + 1):
        update_policy(config, strategy, batch, step)
    peak = _status_mib("VmHWM")
    parameters = list(strategy.model.parameters())
    moments = sum(
        t.numel() * t.element_size()
        for state in strategy.optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    return {
        "parameters": sum(p.numel() for p in parameters),
        "trainable": sum(p.numel() for p in parameters if p.requires_grad),
        "optimizer_mib": moments / 2**20,
        "peak_mib": peak - before,
    }


def _warm_up() -> None:
    """What every setting loads before its model: the modules imported on first use
    (transformers' Qwen2, peft) and autograd's first backward pass."""
    import peft.tuners.lora  # noqa: F401
    import torch
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401

    layer = torch.nn.Linear(8, 8)
    layer(torch.ones(2, 8)).sum().backward()


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def build(root: Path, layers: int, shaped: bool = True) -> dict[str, Path]:
    """The model folder of each of :data:`SHAPES` under ``root`` (the tiny one alone
    unless ``shaped``)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import weight_sync_bench as models

    tiny = models.build_tiny(root / "tiny")
    if not shaped:
        return {"tiny": tiny}
    models.QWEN25_05B["num_hidden_layers"] = layers
    return {"tiny": tiny, SHAPES[1]: models.build_qwen05b_shaped(root / SHAPES[1], tiny)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("MODEL_DIR", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help="tiny: the tiny model, 1 step")
    args = parser.parse_args()
    if args.dry_run:
        args.steps = 1
    if args.one:
        print(json.dumps(measure(Path(args.one[0]), args.one[1], args.steps)))
        return
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as root:
        for shape, model_dir in build(Path(root), args.layers, not args.dry_run).items():
            for mode in MODES:
                command = [sys.executable, __file__, "--one", str(model_dir), mode]
                result = subprocess.run(
                    [*command, "--steps", str(args.steps)], capture_output=True, text=True
                )
                if result.returncode:
                    raise SystemExit(result.stderr[-3000:])
                rows[f"{shape}/{mode}"] = json.loads(result.stdout.splitlines()[-1])
    print_table(
        ("model", "training", "parameters", "trainable", "AdamW state MiB", "peak MiB"),
        [
            (
                *key.split("/"),
                f"{row['parameters']:,}",
                f"{row['trainable']:,} ({100 * row['trainable'] / row['parameters']:.2f} %)",
                f"{row['optimizer_mib']:,.1f}",
                f"{row['peak_mib']:,.0f}",
            )
            for key, row in rows.items()
        ],
        labels=2,
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
