"""GEM's env ids: the registry of the installed ``gem-llm``, plus the ids ROLL's files use.

ROLL's own GEM types (``roll_math``, ``roll_qa``, ``roll_code``) are registered in
GEM's registry as ROLL registers them, each to the env that plays it here.

ROLL pins ``gem-llm==0.0.4``; 0.1.0 (installed here, the newest) dropped the plain game
ids (``game:GuessTheNumber-v0``) in favour of ``-easy``/``-hard``/``-random`` ones. The
ids 0.0.4 had and 0.1.0 lacks are registered again, with 0.0.4's arguments (read from its
``gem/envs/__init__.py``), so ROLL's files name the same game they name there.
"""

from __future__ import annotations

import threading
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

GEM_004_IDS: dict[str, tuple[str, dict[str, Any]]] = {
    "game:GuessTheNumber-v0": (
        "guess_the_number:GuessTheNumberEnv",
        {"min_number": 1, "max_number": 20, "max_turns": 10},
    ),
    "game:GuessTheNumber-v0-hard-no-max-turn": (
        "guess_the_number:GuessTheNumberEnv",
        {"min_number": 1, "max_number": 50, "max_turns": 50},
    ),
    "game:Mastermind-v0": (
        "mastermind:MastermindEnv",
        {"code_length": 4, "num_numbers": 6, "max_turns": 20, "duplicate_numbers": False},
    ),
    "game:Minesweeper-v0": (
        "minesweeper:MinesweeperEnv",
        {"rows": 8, "cols": 8, "num_mines": 10, "max_turns": 100},
    ),
    "game:Minesweeper-v0-very-easy": (
        "minesweeper:MinesweeperEnv",
        {"rows": 3, "cols": 3, "num_mines": 1, "max_turns": 10},
    ),
    "game:Wordle-v0": (
        "wordle:WordleEnv",
        {"word_length": 5, "only_real_words": True, "max_turns": 15},
    ),
    "game:FifteenPuzzle-v0": ("fifteen_puzzle:FifteenPuzzleEnv", {"num_rows": 3, "max_turns": 20}),
    "game:Hangman-v0": (
        "hangman:HangmanEnv",
        {"word_length": 5, "hardcore": False, "max_turns": 15},
    ),
    "game:Sudoku-v0": ("sudoku:SudokuEnv", {"clues": 50, "max_turns": 50, "scale": 9}),
    "game:TowerofHanoi-v0": ("tower_of_hanoi:TowerofHanoiEnv", {"num_disks": 4, "max_turns": 20}),
}
"""gem-llm 0.0.4's game ids that 0.1.0 does not register → (module:class under
``gem.envs.game_env``, the arguments 0.0.4 registered them with)."""

ROLL_TYPES = {
    "roll_math": "agentgym.envs.gem.roll_envs:RollMathEnv",
    "roll_qa": "agentgym.envs.gem.roll_envs:RollQaEnv",
    "roll_code": "gem.envs.code_env:CodeEnv",
}
"""ROLL's own GEM env types (registered in GEM's registry, as ROLL does) → the class
that plays them here (:mod:`agentgym.envs.gem.roll_envs`)."""

_lock = threading.Lock()


def gem_registry() -> dict[str, Any]:
    """GEM's registry (id → spec), with :data:`GEM_004_IDS` added where missing.

    Raises:
        ConfigError: If ``gem-llm`` is not installed (naming the extra).
    """
    try:
        import gem.envs  # noqa: F401  # registers GEM's envs
        from gem.envs.registration import ENV_REGISTRY, register
    except ImportError as error:
        raise ConfigError(
            f"env=gem needs the gem-llm package ({error}): run make setup, or pip install "
            "-e '.[gem]' and then pip install --no-deps gem-llm==0.1.0 (docs/gem.md says why "
            "--no-deps)"
        ) from error
    with _lock:
        for env_id, (entry, kwargs) in GEM_004_IDS.items():
            if env_id not in ENV_REGISTRY:
                register(env_id, f"gem.envs.game_env.{entry}", **kwargs)
        for env_id, entry in ROLL_TYPES.items():
            if env_id not in ENV_REGISTRY:
                register(env_id, entry)
    registry: dict[str, Any] = ENV_REGISTRY
    return registry


def check_id(env_id: str) -> Any:
    """The registry spec of ``env_id``.

    Raises:
        ConfigError: If GEM has no such id, with the close matches among its ids.
    """
    registry = gem_registry()
    if env_id not in registry:
        ids = sorted(registry)
        families = sorted({i.split(":", 1)[0] for i in ids if ":" in i})
        raise ConfigError(
            f"env.kwargs.env_id={env_id!r} is not a GEM env id.{did_you_mean(env_id, ids)} "
            f'GEM has {len(ids)} ids in the families {families} (python -c "import gem, '
            'gem.envs; gem.print_envs()" lists them)'
        )
    return registry[env_id]
