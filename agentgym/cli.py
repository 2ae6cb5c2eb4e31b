"""The ``agentgym`` console command: one name for the project's tools.

``agentgym <command> [arguments]`` runs the command's module with the remaining
arguments, as ``python -m`` does (both work)::

    agentgym train env=sokoban max_steps=2
    agentgym eval checkpoint=outputs/train/<run>/checkpoints/checkpoint-60
    agentgym bench output_dir=outputs/train/<run>
    agentgym play sokoban --seed 3
    agentgym run --config explorer.yaml buffer.batch_size=8
    agentgym serve-env sokoban --port 8000

A misspelt command gets the closest one (``agentgym trian``: did you mean ``train``?).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """One ``agentgym`` command.

    Attributes:
        module: The module whose ``main(argv)`` runs it (``python -m`` runs it too).
        about: What it does, for ``agentgym --help``.
        first: Arguments put before the user's (``bench`` is ``train mode=bench``).
    """

    module: str
    about: str
    first: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "train": Command("agentgym.train", "train a policy: key=value arguments (docs/training.md)"),
    "eval": Command("agentgym.eval", "evaluate a model or checkpoint on validation episodes"),
    "bench": Command(
        "agentgym.train", "evaluate a finished run's checkpoints (mode=bench)", ("mode=bench",)
    ),
    "play": Command("agentgym.play", "play a text env in the terminal"),
    "plan": Command("agentgym.plan", "search Megatron layouts for a model, devices and batch"),
    "run": Command("agentgym.launch", "run a config file (agentgym's, ROLL's or Trinity-RFT's)"),
    "serve-env": Command("agentgym.envs.http.serve", "serve an env over HTTP (docs/http_envs.md)"),
}
"""Every command, in the order ``agentgym --help`` lists them."""


def usage() -> str:
    """The command list, as ``agentgym --help`` prints it."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {command.about}" for name, command in COMMANDS.items()]
    return (
        "usage: agentgym <command> [arguments]   (agentgym <command> --help: its own)\n\n"
        "commands:\n" + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``agentgym <command> ...``; an unknown command exits 2 naming the closest one."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if args else 2)
    name, rest = args[0], args[1:]
    command = COMMANDS.get(name)
    if command is None:
        close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"agentgym: unknown command {name!r}{hint}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    importlib.import_module(command.module).main([*command.first, *rest])


if __name__ == "__main__":
    main()
