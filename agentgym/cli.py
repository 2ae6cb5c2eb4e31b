"""The ``agentgym`` console command: one name for the project's tools.

``agentgym <command> [arguments]`` runs the command's module with the remaining
arguments, as ``python -m`` would::

    agentgym play sokoban --seed 3
    agentgym run --config explorer.yaml buffer.batch_size=8
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "play": ("agentgym.play", "play a text env in the terminal"),
    "plan": ("agentgym.plan", "search Megatron layouts for a model, devices and batch"),
    "run": ("agentgym.launch", "run a config file (agentgym's, ROLL's or Trinity-RFT's)"),
}
"""Command -> (the module whose ``main(argv)`` runs it, what it does)."""


def usage() -> str:
    """The command list, as ``agentgym --help`` prints it."""
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "usage: agentgym <command> [arguments]\n\ncommands:\n" + "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``agentgym <command> ...``; an unknown command exits 2 with the list."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"agentgym: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(COMMANDS[command][0])
    module.main(rest)


if __name__ == "__main__":
    main()
