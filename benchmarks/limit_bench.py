"""agentgym's training step against the limit of its own parts, in one process and one
run: the step's unavoidable work done bare, with no agentgym code, on the same model,
prompts and batch; on each engine (HF, vLLM) and in each mode (``both``; explorer and
trainer as two processes, ``decoupled``).

1. agentgym trains ``--steps`` steps on each engine × mode (Sokoban on the embedded
   tiny model; ``limit_runs.py``); each step's ``time/*`` are logged, the engine's own
   generation is timed inside the engine, and the last step's trajectories are kept.
   ``decoupled`` is Trinity-RFT's job: an explorer process (``mode: explore``) and the
   trainer (``mode: train``, timed here), weights by checkpoint, one step off-policy.
2. The bare parts of each run's last step, each the best of ``--rounds``:
   - **generation**: for the HF engine, transformers' ``generate`` (the same sampling)
     of each turn's prompts as the engine received them, a batch per turn index; for
     vLLM, vLLM's own ``LLM.generate`` (the engine arguments agentgym gives it on the
     CPU, the same sampling) of the same batches, each request generating as many
     tokens as its response had (``ignore_eos``);
   - **env**: the env's own ``reset`` and ``step`` calls on the same seeds and responses;
   - **training**: one plain-torch pass over the samples the step's update trained
     (one a turn in ``step`` mode, the zero-variance groups dropped), as the config
     batches them (micro-batches of ``per_device_train_batch_size``, an AdamW step every
     ``gradient_accumulation_steps``): forward, token log-probabilities, a policy-gradient
     loss on the response tokens, backward.
3. Two ratios of agentgym's median step (after the first, warm-up step; the step
   itself, so that its parts add up to it): over the sum of the bare parts, and over
   the work of its own parts (its engine's generation, the env's calls, its update),
   and where the step's time goes: the engine, the
   rollout machinery around it, batch preparation (log-probabilities of π_old and the
   reference, advantages), the update beyond bare training, the weight sync; decoupled,
   the trainer's wait for the explorer's groups and the explorer's side (its engine,
   its rollout machinery, its weight loads: another process, overlapping the step).
   Every share above 2% is marked; a table at the end has a row per engine × mode.

    python benchmarks/limit_bench.py [--engine hf|vllm|all] [--mode both|decoupled|all]
        [--steps 6] [--rounds 3] [--json PATH] [--dry-run]

``--dry-run``: 4 episodes a step, 2 steps, one round, short responses
(tests/test_limit_bench.py runs it: what is timed works, not how fast).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from limit_runs import DRY, Run, run_both, run_decoupled

import agentgym
from agentgym.trajectory import Trajectory

ENGINES = ("hf", "vllm")
MODES = ("both", "decoupled")
KEYS = (
    "time/step", "time/rollout", "time/engine", "time/train", "time/weight_sync",
    "time/trainer_wait",
)  # fmt: skip


def turn_prompts(trajectory: Trajectory) -> list[list[int]]:
    """The prompt the engine received at each turn: in ``step`` mode the turn's own
    (its ``prompt_ids``), in ``trajectory`` mode all of its sample before it."""
    if trajectory.mode == "step":
        return [list(turn.prompt_ids) for turn in trajectory.turns]
    prompts: list[list[int]] = []
    history: list[int] = []
    for turn in trajectory.turns:
        history = [*(history if not turn.starts_sample else []), *turn.prompt_ids]
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


def bare_training(
    model: Any, trained: Sequence[tuple[list[int], list[float]]], config: Any
) -> float:
    """Seconds of one plain-torch pass over the samples the step's update trained (the
    zero-variance groups dropped), batched as configured."""
    args = config.actor_train.training_args
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(args.learning_rate))
    samples = sorted(trained, key=lambda s: len(s[0]))  # like length beside like: less padding
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


def by_turn(trajectories: Sequence[Trajectory]) -> list[list[tuple[list[int], int]]]:
    """Each turn index's requests: (the prompt, the response's token count)."""
    turns: dict[int, list[tuple[list[int], int]]] = {}
    for trajectory in trajectories:
        for index, (prompt, turn) in enumerate(
            zip(turn_prompts(trajectory), trajectory.turns, strict=True)
        ):
            turns.setdefault(index, []).append((prompt, len(turn.response_ids)))
    return list(turns.values())


def vllm_engine(config: Any) -> Any:
    """vLLM's own ``LLM`` with the engine arguments agentgym's backend uses on the CPU
    (``VLLMBackend.for_cpu``: float32, eager, a 64 MiB KV cache)."""
    from vllm import LLM

    from agentgym.builders.model import model_path

    return LLM(
        model=str(model_path(config)),
        dtype="float32",
        max_model_len=int(config.sequence_length),
        seed=int(config.seed),
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
    )


def bare_vllm_generation(llm: Any, trajectories: Sequence[Trajectory], config: Any) -> float:
    """Seconds of ``LLM.generate`` over the step's prompts, a call per turn index, each
    request generating its response's token count."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = config.actor_infer.generating_args
    seconds = 0.0
    for requests in by_turn(trajectories):
        prompts = [TokensPrompt(prompt_token_ids=prompt) for prompt, _ in requests]
        params = [
            SamplingParams(
                temperature=float(sampling.temperature),
                top_p=float(sampling.top_p),
                top_k=int(sampling.top_k) if int(sampling.top_k) > 0 else 0,
                max_tokens=max(length, 1),
                ignore_eos=True,
                detokenize=False,
            )
            for _, length in requests
        ]
        started = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        seconds += time.perf_counter() - started
    return seconds


def bare_parts(run: Run, generate: Any, model: Any, rounds: int) -> dict[str, float]:
    """The bare parts of ``run``'s last step, each the best of ``rounds`` (the limit is
    what the part can do; on a shared machine a round can be several times slower): its
    engine's generation, the env, training (on a copy of ``model`` each round, so that
    every pass starts from the same weights)."""
    config = run.config
    return {
        "generation": min(generate(run.kept, config) for _ in range(rounds)),
        "env": min(bare_env(run.kept, config) for _ in range(rounds)),
        "training": min(
            bare_training(copy.deepcopy(model), run.trained, config) for _ in range(rounds)
        ),
    }


def figures(run: Run, bare: dict[str, float]) -> dict[str, Any]:
    """The run's median step (its ``time/*``), its two ratios and its breakdown
    (seconds, by name)."""
    measured = run.rows[1:] or run.rows  # the first step warms up
    # the median step itself (the lower of two), so that its parts add up to it
    middle = sorted(measured, key=lambda r: r["time/step"])[(len(measured) - 1) // 2]
    median = {key: middle.get(key, 0.0) for key in KEYS} | {"step": middle["step"]}
    step = median["time/step"]
    update = median["time/train"] - median["time/weight_sync"]
    shares = {
        "update beyond bare training": update - bare["training"],
        "batch preparation (pi_old, reference, advantages)": step
        - median["time/rollout"]
        - median["time/train"],
    }
    if run.mode == "both":
        engine = median["time/engine"]
        shares = {
            f"engine's own generation (agentgym's {run.engine} engine)": engine,
            "rollout machinery (rollout - engine - bare env)": median["time/rollout"]
            - engine
            - bare["env"],
            **shares,
            "weight sync": median["time/weight_sync"],
        }
    else:
        explorer = run.explorer
        engine = explorer["engine"]
        wait = median["time/trainer_wait"]
        shares = {
            "trainer waits for the explorer's groups": wait,
            "trainer reads the batch (rollout - wait)": median["time/rollout"] - wait,
            **shares,
            "weight sync: the trainer publishes (checkpoint)": median["time/weight_sync"],
            f"explorer, in parallel: its {run.engine} engine's own generation a batch": engine,
            "explorer, in parallel: rollout machinery (batch - engine - bare env)": explorer[
                "explore_batch"
            ]
            - engine
            - bare["env"],
            "explorer, in parallel: weight sync, loading a version": explorer["weight_load"],
        }
    return {
        "engine": run.engine,
        "mode": run.mode,
        "episodes": len(run.kept),
        "samples": len(run.trained),
        "kept_samples_logged": run.rows[-1].get("train/kept_samples"),
        "median": median,
        "explorer": run.explorer,
        "bare": bare,
        "shares": shares,
        "ratio": step / sum(bare.values()),
        "own": step / (engine + bare["env"] + update),
    }


def print_row(row: dict[str, Any]) -> None:
    """One run's parts and shares, and its two ratios."""
    step, bare, shares = row["median"]["time/step"], row["bare"], row["shares"]
    threads = row["explorer"].get("threads")
    print(
        f"\n{row['engine']}, {row['mode']}: {row['episodes']} episodes a step (the last: "
        f"{row['samples']} samples trained); agentgym's median step {step:.3f} s "
        f"(step {row['median']['step']:.0f})"
        + (f" (torch on {threads:.0f} thread(s) in each process)" if threads else "")
    )
    print("| part | seconds | share of the step |")
    print("| --- | ---: | ---: |")
    for name, seconds in {**{f"bare {k}": v for k, v in bare.items()}, **shares}.items():
        flag = " **" if seconds / step > 0.02 and not name.startswith("bare") else ""
        print(f"| {name}{flag} | {seconds:.3f} | {seconds / step:.1%} |")
    own = "its engine's generation, the env, its update"
    print(
        f"step ÷ bare parts (the engine's own generate, the env, plain torch) = {row['ratio']:.2f}×"
    )
    print(f"step ÷ its own parts' work ({own}) = {row['own']:.2f}× (goal <= 1.15)")


def print_table(rows: Sequence[dict[str, Any]]) -> None:
    """A row per engine × mode: the step, the bare parts, both ratios, the shares above
    2% of the step."""
    print("\n| engine | mode | step (s) | bare parts (s) | step ÷ bare | step ÷ own parts | "
          "shares above 2% of the step |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        step = row["median"]["time/step"]
        above = ", ".join(
            f"{name} {seconds / step:.0%}"
            for name, seconds in row["shares"].items()
            if seconds / step > 0.02
        )
        print(
            f"| {row['engine']} | {row['mode']} | {step:.3f} | {sum(row['bare'].values()):.3f} "
            f"| {row['ratio']:.2f}× | {row['own']:.2f}× | {above} |"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=[*ENGINES, "all"], default="all")
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="the bare parts: best of")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from agentgym.builders.model import model_path

    engines = ENGINES if args.engine == "all" else (args.engine,)
    modes = MODES if args.mode == "all" else (args.mode,)
    steps, extra, rounds = (2, DRY, 1) if args.dry_run else (args.steps, [], args.rounds)
    output = Path(tempfile.mkdtemp(prefix="limit-bench-"))
    runs: list[Run] = []
    for engine in engines:
        for mode in modes:
            folder = output / f"{engine}-{mode}"
            play = run_both if mode == "both" else run_decoupled
            runs.append(play(engine, steps, folder, extra))
    config = runs[0].config
    model = AutoModelForCausalLM.from_pretrained(str(model_path(config))).eval()
    generators: dict[str, Any] = {}
    if "hf" in engines:
        bare_generation(model, runs[0].kept[:8], config)  # warm-up, as agentgym's first step is
        generators["hf"] = lambda kept, config: bare_generation(model, kept, config)
    bare_training(copy.deepcopy(model), runs[0].trained[:32], config)
    if "vllm" in engines:
        llm = vllm_engine(config)
        bare_vllm_generation(llm, runs[0].kept[:8], config)  # warm-up
        generators["vllm"] = lambda kept, config: bare_vllm_generation(llm, kept, config)
    rows = [figures(run, bare_parts(run, generators[run.engine], model, rounds)) for run in runs]
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"\n{os.cpu_count()} CPUs, torch on {torch.get_num_threads()} threads; load {load}")
    for row in rows:
        print_row(row)
    print_table(rows)
    result = {"rows": rows, "load": os.getloadavg(), "threads": torch.get_num_threads()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
