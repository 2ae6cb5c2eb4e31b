"""agentgym's training step against the limit of its own parts, in one process and one
run: the step's unavoidable work done bare, with no agentgym code, on the same model,
prompts and batch.

1. agentgym trains ``--steps`` steps (mode both, in process, the HF engine; Sokoban on
   the embedded tiny model); each step's ``time/*`` are logged, and the last step's
   trajectories are kept.
2. The bare parts of that step:
   - **generation**: transformers' ``generate`` (the same sampling) of each turn's
     prompts as the engine received them, a batch per turn index, each batch generating
     as many tokens as its longest response (the engine's batch runs that long too);
   - **env**: the env's own ``reset`` and ``step`` calls on the same seeds and responses;
   - **training**: one plain-torch pass over the step's packed samples, as the config
     batches them (micro-batches of ``per_device_train_batch_size``, an AdamW step every
     ``gradient_accumulation_steps``): forward, token log-probabilities, a policy-gradient
     loss on the response tokens, backward.
3. Two ratios of agentgym's median step time (after the first, warm-up step): over the
   sum of the bare parts, and over the work of its own parts (its engine's generation,
   timed inside the HF engine, the env's calls, its update), and where the step's time
   goes: the engine, the rollout machinery around it, batch preparation
   (log-probabilities of π_old and the reference, advantages), the update beyond bare
   training, the weight sync; every share above 2% is marked.

    python benchmarks/limit_bench.py [--steps 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import agentgym
from agentgym.rollout.source import StepRollout, SyncSource
from agentgym.trajectory import Trajectory

OVERRIDES = [
    "env=sokoban", "generation=hf", "train_env_manager.env_groups=8",
    "train_env_manager.group_size=8", "rollout_batch_size=64", "eval_steps=0",
    "actor_train.training_args.per_device_train_batch_size=16",
    "actor_train.training_args.gradient_accumulation_steps=2", "save_steps=1000",
]  # fmt: skip


def agentgym_steps(steps: int, output: Path) -> tuple[Any, list[dict[str, float]], list[Any]]:
    """Train ``steps`` steps; the checked config, each step's metrics and the last step's
    trajectories."""
    from agentgym.builders.train import build_train
    from agentgym.schema import validate
    from agentgym.trainers.grpo import train

    with initialize_config_module("agentgym.configs", version_base=None):
        raw: Any = OmegaConf.to_container(
            compose("config", overrides=[*OVERRIDES, f"max_steps={steps}", f"output_dir={output}"]),
            resolve=True,
        )
    config = validate(raw)
    grpo, parts = build_train(config, raw)
    kept: list[Trajectory] = []
    original = SyncSource.next_batch

    async def keeping(source: SyncSource, step: int) -> StepRollout:
        rollout: StepRollout = await original(source, step)
        kept[:] = rollout.trajectories
        return rollout

    from agentgym.rollout.backends.hf import HFBackend

    batch = HFBackend._generate_batch
    engine: dict[int, float] = {}
    engine_steps: list[int] = []

    def timed(backend: HFBackend, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return batch(backend, *args, **kwargs)
        finally:
            step = engine_steps[-1] if engine_steps else 0
            engine[step] = engine.get(step, 0.0) + time.perf_counter() - started

    async def counting(source: SyncSource, step: int) -> StepRollout:
        engine_steps.append(step)
        return await keeping(source, step)

    SyncSource.next_batch = counting  # type: ignore[method-assign,assignment]
    HFBackend._generate_batch = timed  # type: ignore[method-assign,assignment]
    try:
        train(grpo, parts)
    finally:
        SyncSource.next_batch = original  # type: ignore[method-assign]
        HFBackend._generate_batch = batch  # type: ignore[method-assign]
    rows = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    logged = [r for r in rows if "time/step" in r]
    for row in logged:  # the engine's own generation time in each step's rollout
        row["time/engine"] = engine.get(int(row["step"]), 0.0)
    return config, logged, kept


def turn_prompts(trajectory: Trajectory) -> list[list[int]]:
    """The prompt the engine received at each turn (trajectory mode: all before it)."""
    prompts: list[list[int]] = []
    history: list[int] = []
    for turn in trajectory.turns:
        history = [*history, *turn.prompt_ids]
        prompts.append(history)
        history = [*history, *turn.response_ids]
    return prompts


def bare_generation(model: Any, trajectories: Sequence[Trajectory], config: Any) -> float:
    """Seconds of ``generate`` over the step's prompts, a left-padded batch per turn."""
    sampling = config.actor_infer.generating_args
    by_turn: dict[int, list[list[int]]] = {}
    for trajectory in trajectories:
        for index, prompt in enumerate(turn_prompts(trajectory)):
            by_turn.setdefault(index, []).append(prompt)
    seconds = 0.0
    for requests in by_turn.values():
        width = max(len(p) for p in requests)
        ids = torch.zeros(len(requests), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(requests):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                max_new_tokens=int(sampling.max_new_tokens),
                pad_token_id=0,
            )
        seconds += time.perf_counter() - started
    return seconds


def bare_env(trajectories: Sequence[Trajectory], config: Any) -> float:
    """Seconds of the env's own ``reset`` and ``step`` calls on the step's episodes."""
    section = config.train_env_manager
    kwargs = dict(config.env.kwargs)
    if section.format_penalty is not None:
        kwargs["format_penalty"] = section.format_penalty
    envs = [agentgym.make(t.env_name, **kwargs) for t in trajectories]
    started = time.perf_counter()
    for env, trajectory in zip(envs, trajectories, strict=True):
        env.reset(seed=trajectory.seed)
        for turn in trajectory.turns:
            env.step(turn.response_text)
    return time.perf_counter() - started


def bare_training(model: Any, trajectories: Sequence[Trajectory], config: Any) -> float:
    """Seconds of one plain-torch pass over the step's samples, batched as configured."""
    args = config.actor_train.training_args
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
    samples = sorted(  # like length beside like length: less padding
        ((t.input_ids, t.loss_mask) for t in trajectories if t.turns), key=lambda s: len(s[0])
    )
    micro, accumulate = int(args.per_device_train_batch_size), int(args.gradient_accumulation_steps)
    model.train()
    started = time.perf_counter()
    for index in range(0, len(samples), micro):
        rows = samples[index : index + micro]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        loss_mask = torch.zeros(len(rows), width)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        for row, (sample, sample_mask) in enumerate(rows):
            ids[row, : len(sample)] = torch.tensor(sample)
            loss_mask[row, : len(sample)] = torch.tensor(sample_mask, dtype=torch.float)
            attention[row, : len(sample)] = 1
        logits = (
            model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        )  # [B, T-1, V]
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]  # [B, T-1]
        advantages = torch.ones_like(logprobs)
        mask = loss_mask[:, 1:]
        loss = -(logprobs * advantages * mask).sum() / mask.sum().clamp(min=1)
        (loss / accumulate).backward()
        if (index // micro + 1) % accumulate == 0 or index + micro >= len(samples):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    output = Path(tempfile.mkdtemp(prefix="limit-bench-"))
    config, rows, kept = agentgym_steps(args.steps, output)
    measured = rows[1:] or rows  # the first step warms up
    median = {
        key: statistics.median(r.get(key, 0.0) for r in measured)
        for key in ("time/step", "time/rollout", "time/engine", "time/train", "time/weight_sync")
    }
    from agentgym.builders.model import model_path

    model = AutoModelForCausalLM.from_pretrained(str(model_path(config))).eval()
    bare_generation(model, kept[:8], config)  # warm-up, as agentgym's first step is
    bare_training(copy.deepcopy(model), kept[:16], config)
    bare = {
        "generation": bare_generation(model, kept, config),
        "env": bare_env(kept, config),
        "training": bare_training(model, kept, config),
    }
    step = median["time/step"]
    prep = step - median["time/rollout"] - median["time/train"]
    shares = {
        "engine's own generation (agentgym's HF engine)": median["time/engine"],
        "rollout machinery (rollout - engine - bare env)": median["time/rollout"]
        - median["time/engine"]
        - bare["env"],
        "batch preparation (pi_old, reference, advantages)": prep,
        "update beyond bare training": median["time/train"]
        - median["time/weight_sync"]
        - bare["training"],
        "weight sync": median["time/weight_sync"],
    }
    ratio = step / sum(bare.values())
    print(f"{len(kept)} episodes a step; agentgym's median step {step:.3f} s")
    print("| part | seconds | share of the step |")
    print("| --- | ---: | ---: |")
    for name, seconds in {**{f"bare {k}": v for k, v in bare.items()}, **shares}.items():
        flag = " **" if seconds / step > 0.02 and not name.startswith("bare") else ""
        print(f"| {name}{flag} | {seconds:.3f} | {seconds / step:.1%} |")
    update = median["time/train"] - median["time/weight_sync"]
    own = step / (median["time/engine"] + bare["env"] + update)
    print(f"step ÷ bare parts (transformers' generate, the env, plain torch) = {ratio:.2f}×")
    print(
        f"step ÷ its own parts' work (its engine's generation, the env, its update) = "
        f"{own:.2f}× (goal <= 1.15)"
    )
    result = {"median": median, "bare": bare, "shares": shares, "ratio": ratio, "own": own}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
