"""Play any text env in the terminal: a registered name, an agentgym id or a Gymnasium id.

Usage::

    python -m agentgym.play sokoban --seed 3
    python -m agentgym.play frozen_lake --set size=6 --set is_slippery=true

Type an action name (``up``), several separated by ``||`` if the env allows,
or a full response (``<answer>Up</answer>``). The arrow keys are the four
moves of the grid envs. A misspelled action name is offered its close match
(``rigth`` -> ``Right?``) before anything is sent. Commands (never sent to the env): ``:help``,
``:hint`` (the solver's plan or the expert's answer), ``:reset`` (next seed),
``:q``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

import agentgym
from agentgym.envs.adapter import GymTextEnv, make_text_env
from agentgym.envs.parsing import ACTION_SEPARATOR
from agentgym.envs.scripted import format_response
from agentgym.envs.text_env import TextEnv

COMMANDS = {
    ":help": "list these commands",
    ":hint": "show the solver's plan or the expert's next answer",
    ":reset": "start a new episode with the next seed",
    ":q": "quit (also :quit, quit, exit, or end of input)",
}
QUIT = (":q", ":quit", "quit", "exit")
ARROWS = {"\x1b[A": "Up", "\x1b[B": "Down", "\x1b[C": "Right", "\x1b[D": "Left"}
"""Escape sequences of the arrow keys (a terminal without line editing sends them as typed)."""
_MARKUP = ("<answer>", "<think>", "<tool_call>")


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


def arrow_actions(line: str, env: TextEnv) -> list[str] | None:
    """The moves of a line made only of arrow keys, in a grid env; else None."""
    if not line.startswith("\x1b") or not set(ARROWS.values()) <= set(env.action_names):
        return None
    moves, rest = [], line
    while rest:
        key = next((k for k in ARROWS if rest.startswith(k)), None)
        if key is None:
            return None
        moves.append(ARROWS[key])
        rest = rest[len(key) :]
    return moves


def misspelled(line: str, env: TextEnv) -> list[tuple[str, str | None]]:
    """Typed action names that are not in the env's vocabulary, each with its close match."""
    if not env.action_names or any(tag in line.lower() for tag in _MARKUP):
        return []
    lookup = {name.lower(): name for name in env.action_names}
    found = []
    for part in (p.strip() for p in line.split(ACTION_SEPARATOR)):
        if part and " ".join(part.split()).lower() not in lookup:
            close = difflib.get_close_matches(part.lower(), list(lookup), n=1, cutoff=0.75)
            found.append((part, lookup[close[0]] if close else None))
    return found


def to_response(line: str, env: TextEnv) -> str:
    """A typed line as a model response: bare action names are wrapped in the env's format;
    lines with markup (``<answer>``, ``<think>``, ``<tool_call>``) and lines for plain
    Gymnasium envs (which take the raw text) pass unchanged."""
    raw = isinstance(env, GymTextEnv) and env.answer_format is None
    if raw or any(tag in line.lower() for tag in _MARKUP):
        return line
    return format_response([part.strip() for part in line.split("||")], env.response_format)


def play(env: TextEnv, seed: int, stdin: TextIO, stdout: TextIO) -> None:
    """Run the interactive loop until ``:q`` or end of input."""

    def say(text: str) -> None:
        print(text, file=stdout, flush=True)

    def ask(prompt: str) -> str | None:
        print(prompt, end="", file=stdout, flush=True)
        line = stdin.readline()
        return line.rstrip("\r\n") if line else None

    say(env.instructions)
    say("Type :help for the commands.")
    episode_return = 0.0

    def new_episode() -> None:
        nonlocal episode_return
        observation, _ = env.reset(seed=seed)
        episode_return = 0.0
        say(f"\n[seed {seed}]\n{observation}")

    new_episode()
    while True:
        line = ask("action> ")
        if line is None:
            say("")
            return
        moves = arrow_actions(line, env)
        line = line.strip()
        if not line:
            continue
        if line in QUIT:
            return
        if line == ":help":
            say("\n".join(f"  {name:<7} {text}" for name, text in COMMANDS.items()))
            continue
        if line == ":hint":
            say(_hint(env))
            continue
        if line == ":reset":
            seed += 1
            new_episode()
            continue
        if line.startswith(":"):
            say(f"unknown command {line!r}; :help lists the commands (nothing was sent)")
            continue
        texts = [to_response(move, env) for move in moves] if moves else None
        if texts is None:
            corrected = _correct(line, env, ask)
            if corrected is None:
                continue
            texts = [to_response(corrected, env)]
        for text in texts:
            observation, reward, terminated, truncated, info = env.step(text)
            episode_return += reward
            valid = "" if info["action_is_valid"] else f"  (invalid: {info['parse_error']})"
            say(f"{observation}\nreward {reward:+.2f}  return {episode_return:+.2f}{valid}")
            if terminated or truncated:
                outcome = (
                    "solved" if info["success"] else ("out of steps" if truncated else "failed")
                )
                say(f"episode over: {outcome}, return {episode_return:+.2f}. New episode:")
                seed += 1
                new_episode()
                break


def _correct(line: str, env: TextEnv, ask: Any) -> str | None:
    """Offer the close match of each misspelled action name (Enter or y takes it, n
    keeps the typed one); None at end of input. Names with no close match are sent
    as typed, and the env says why they are invalid."""
    for typed, close in misspelled(line, env):
        if close is None:
            continue
        reply = ask(f"{typed!r} is not an action. Did you mean {close!r}? [Y/n] ")
        if reply is None:
            return None
        if reply.strip().lower() in ("", "y", "yes"):
            parts = [p.strip() for p in line.split(ACTION_SEPARATOR)]
            line = f" {ACTION_SEPARATOR} ".join(close if p == typed else p for p in parts)
    return line


def _hint(env: TextEnv) -> str:
    oracle = getattr(env, "oracle_response", None)
    if callable(oracle):
        return f"expert: {oracle()}"
    solve = getattr(env, "solve", None)
    return f"plan: {solve()}" if callable(solve) else "this env has no solver"


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="agentgym play", description="Play a text env in the terminal."
    )
    parser.add_argument("env", help=f"env name or Gymnasium id; registered: {agentgym.list_envs()}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="env constructor argument"
    )
    args = parser.parse_args(argv)
    try:
        env = make_text_env(args.env, parse_overrides(args.set))
    except (agentgym.UnknownEnvError, agentgym.PluginError, ValueError, TypeError) as exc:
        parser.exit(2, f"error: {exc}\n")
    play(env, args.seed, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
