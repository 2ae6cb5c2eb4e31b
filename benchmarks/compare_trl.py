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

``--dry-run`` (CI, without TRL): a model warm-started for 2 steps, the overhead table
on 16 episodes, our run for 1 step of 2 groups and, where trl is importable, TRL's for
1 step; it checks the figures' shapes, not the times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compare_trl_overhead import OVERHEAD_SETUPS, print_overhead, rollout_overhead
from compare_trl_runs import ENGINES, FRAMEWORKS, GROUP_SIZE, GROUPS, OURS_LIKE, build_model, worker
from machine import machine, print_machine


def measure(
    framework: str, engine: str, model: Path, steps: int, dry: bool = False
) -> dict[str, Any]:
    """One run's raw figures, from a worker process of this script (``dry``: ours at
    :data:`DRY_GROUPS` groups)."""
    with tempfile.TemporaryDirectory(prefix=f"trl-compare-{framework}-") as folder:
        out = Path(folder)
        command = [sys.executable, __file__, "--worker", framework, "--engine", engine]
        command += ["--model", str(model), "--steps", str(steps), "--out", str(out)]
        command += ["--dry-run"] if dry else []
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{framework} ({engine}) failed:\n{done.stderr[-4000:]}")
        figures: dict[str, Any] = json.loads((out / "figures.json").read_text())
        return figures


def summary(figures: dict[str, Any], warmup: int) -> dict[str, Any]:
    """A run's medians after ``warmup`` steps, with its raw figures."""
    seconds = statistics.median(figures["step_seconds"][warmup:])
    tokens = statistics.median(figures["tokens"][warmup:])
    rollout = statistics.median(figures["rollout_seconds"][warmup:])
    return {
        "s_per_step": seconds,
        "rollout_s": rollout,  # generation and reward (TRL: _generate_and_score_completions)
        "update_s": seconds - rollout,
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
    """The rounds and the tables; with ``--worker``, one run (in its own process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps of a run not counted")
    parser.add_argument(
        "--warmup-runs", type=int, default=1, help="untimed like-for-like runs before round 1"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--overhead-only", action="store_true", help="only the rollout overhead table"
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes; TRL only if installed")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=(*ENGINES, OURS_LIKE), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        groups = DRY_GROUPS if args.dry_run else GROUPS
        worker(args.worker, args.engine, args.model, args.steps, args.out, groups)
        return
    if args.dry_run:
        dry_run(args.json)
        return
    if args.overhead_only:
        print_overhead([rollout_overhead(*setup) for setup in OVERHEAD_SETUPS])
        return
    settings = {**machine(), **probe_threads()}
    print("machine and thread settings (the workers' as a fresh process gets them):")
    print_machine(settings)
    model = build_model(Path(tempfile.gettempdir()) / "agentgym-compare-trl")
    for _ in range(args.warmup_runs):  # the first runs of a machine load files cold
        for framework, engine in (("agentgym", OURS_LIKE), ("trl", "hf")):
            seconds = statistics.median(measure(framework, engine, model, 2)["step_seconds"])
            print(f"warm-up  {framework:8} {engine:6} {seconds:.3f} s/step (not counted)")
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
        figures = {"machine": settings, "rounds": rounds, "overhead": overhead}
        args.json.write_text(json.dumps(figures, indent=1))


def probe_threads() -> dict[str, Any]:
    """The thread settings a fresh worker process gets (both frameworks' workers run
    with this environment; neither changes its thread count)."""
    code = "import json, machine; print(json.dumps(machine.thread_settings()))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    settings: dict[str, Any] = json.loads(done.stdout)
    return {f"worker_{key}": value for key, value in settings.items()}


DRY_GROUPS = 2
"""Groups of our run's step in the dry run."""
DRY_MODEL = (
    "model.warm_start.steps=2", "model.warm_start.batch_size=8",
    "model.warm_start.examples_per_env=64",
)  # fmt: skip
"""The dry run's model: the default run's, warm-started for 2 steps only."""


def dry_run(out: Path | None) -> None:
    """What the comparison times, at tiny sizes, its figures checked (not their times)."""
    model = build_model(Path(tempfile.gettempdir()) / "agentgym-compare-trl-dry", DRY_MODEL)
    episodes = DRY_GROUPS * GROUP_SIZE
    overhead = [
        rollout_overhead(*setup, episodes=episodes, repeats=2, model=model)
        for setup in OVERHEAD_SETUPS
    ]
    print_overhead(overhead)
    runs = {"agentgym": measure("agentgym", OURS_LIKE, model, 1, dry=True)}
    if importlib.util.find_spec("trl") is None:
        print('trl is not installed (pip install -e ".[compare]"): TRL\'s run skipped')
    else:
        runs["trl"] = measure("trl", "hf", model, 1)
    for framework, figures in runs.items():
        steps, rewards = figures["step_seconds"], figures["reward"]
        if not (len(steps) == len(rewards) == 1 and steps[0] > 0 and figures["tokens"][0] > 0):
            raise SystemExit(f"{framework}: not one step with figures: {figures}")
        print(
            f"{framework} dry run ({figures['engine']}): 1 step in {steps[0]:.2f} s, "
            f"{figures['tokens'][0]:.0f} tokens, reward {rewards[0]:+.3f}"
        )
    if out:
        out.write_text(json.dumps({"runs": runs, "overhead": overhead}, indent=1))


FIGURES = (
    ("s_per_step", "seconds per step", False),
    ("samples_per_s", "samples/s", True),
    ("tokens_per_s", "generated tokens/s", True),
    ("peak_rss_mb", "peak RSS, MB", False),
)


def print_tables(rounds: list[dict[str, Any]], overhead: list[dict[str, Any]]) -> None:
    """The comparison table, the learning curves and the overhead lines."""
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
    print("\nper round (TRL's seconds per step over ours), and where each side's step goes:\n")
    print("| round | like | best | ours like: rollout + update, s | TRL: rollout + update, s |")
    print("|---|---|---|---|---|")
    for number, pair in enumerate(pairs, 1):
        ratio = {n: pair[n]["trl"]["s_per_step"] / pair[n]["agentgym"]["s_per_step"] for n in pair}
        ours, theirs = pair["like"]["agentgym"], pair["like"]["trl"]
        print(
            f"| {number} | {ratio['like']:.2f}× | {ratio['best']:.2f}× "
            f"| {ours['rollout_s']:.3f} + {ours['update_s']:.3f} "
            f"| {theirs['rollout_s']:.3f} + {theirs['update_s']:.3f} |"
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
