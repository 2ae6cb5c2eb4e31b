"""``agentgym run --config FILE [key=value ...]``: run a config file, in Trinity-RFT's
habit, whatever framework wrote it (agentgym's own, ROLL's, Trinity-RFT's).

The file's folder and name become Hydra's ``--config-path`` and ``--config-name``,
and :func:`agentgym.train.main` reads it as ``python -m agentgym.train`` would:
ROLL's and Trinity's files are translated (:mod:`agentgym.formats`), the remaining
``key=value`` arguments apply as they do there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from agentgym.train import main as train_main


def arguments(argv: Sequence[str]) -> list[str]:
    """``python -m agentgym.train``'s arguments for ``agentgym run`` with ``argv``.

    Raises:
        SystemExit: On a missing ``--config`` or a file that does not exist (exit 2).
    """
    parser = argparse.ArgumentParser(
        prog="agentgym run", description="Run an agentgym, ROLL or Trinity-RFT config file."
    )
    parser.add_argument("--config", required=True, help="the config file (.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value arguments")
    args, hydra_flags = parser.parse_known_args(list(argv))  # --cfg job, --help: Hydra's
    path = Path(args.config).expanduser()
    if not path.is_file():
        parser.error(f"--config {args.config}: no such file")
    return [
        "--config-path",
        str(path.parent.resolve()),
        "--config-name",
        path.stem,
        *args.overrides,
        *hydra_flags,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``agentgym run``."""
    train_main(arguments(sys.argv[1:] if argv is None else argv))
