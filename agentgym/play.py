"""Play any registered text env in the terminal.

Usage::

    python -m agentgym.play sokoban --seed 3
    python -m agentgym.play frozen_lake --set size=6 --set is_slippery=true

Type an action name (``up``), several separated by ``||`` if the env allows,
or a full response (``<answer>Up</answer>``). Commands: ``:hint`` shows the
solver's plan, ``:reset`` starts a new episode (next seed), ``:q`` quits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

import agentgym
from agentgym.envs.scripted import format_response
from agentgym.envs.text_env import TextEnv
from agentgym.eval import make_text_env


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Turn ``["size=6", "dim_room=[8, 8]"]`` into constructor kwargs (values read as YAML).

    Raises:
        ValueError: If an item has no ``=``.
    """
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        kwargs[key.strip()] = yaml.safe_load(value)
    return kwargs


def to_response(line: str, env: TextEnv) -> str:
    """A typed line as a model response: bare action names are wrapped in the env's format;
    lines with markup (``<answer>``, ``<think>``, ``<tool_call>``) pass unchanged."""
    if any(tag in line.lower() for tag in ("<answer>", "<think>", "<tool_call>")):
        return line
    return format_response([part.strip() for part in line.split("||")], env.response_format)


def play(env: TextEnv, seed: int, stdin: TextIO, stdout: TextIO) -> None:
    """Run the interactive loop until ``:q`` or end of input."""

    def say(text: str) -> None:
        print(text, file=stdout, flush=True)

    say(env.instructions)
    episode_return = 0.0

    def new_episode() -> None:
        nonlocal episode_return
        observation, _ = env.reset(seed=seed)
        episode_return = 0.0
        say(f"\n[seed {seed}]\n{observation}")

    new_episode()
    while True:
        print("action> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line:
            say("")
            return
        line = line.strip()
        if not line:
            continue
        if line in (":q", ":quit", "quit", "exit"):
            return
        if line == ":hint":
            oracle = getattr(env, "oracle_response", None)
            solve = getattr(env, "solve", None)
            if callable(oracle):
                say(f"expert: {oracle()}")
            else:
                say(f"plan: {solve()}" if solve else "this env has no solver")
            continue
        if line == ":reset":
            seed += 1
            new_episode()
            continue
        observation, reward, terminated, truncated, info = env.step(to_response(line, env))
        episode_return += reward
        valid = "" if info["action_is_valid"] else f"  (invalid: {info['parse_error']})"
        say(f"{observation}\nreward {reward:+.2f}  return {episode_return:+.2f}{valid}")
        if terminated or truncated:
            outcome = "solved" if info["success"] else ("out of steps" if truncated else "failed")
            say(f"episode over: {outcome}, return {episode_return:+.2f}. New episode:")
            seed += 1
            new_episode()


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m agentgym.play", description="Play a registered text env in the terminal."
    )
    parser.add_argument("env", help=f"env name or id, one of {agentgym.list_envs()}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="env constructor argument"
    )
    args = parser.parse_args(argv)
    try:
        env = make_text_env(args.env, parse_overrides(args.set))
    except (agentgym.UnknownEnvError, ValueError, TypeError) as exc:
        parser.exit(2, f"error: {exc}\n")
    play(env, args.seed, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
