"""A third-party plugin package for tests, built and installed with pip into a folder.

``agentgym-test-plugins`` declares four ``agentgym.envs`` entry points:

* ``coin``: a plain ``gymnasium.Env`` with ``Text`` spaces that reports
  ``action_is_valid`` and ``success`` in its info;
* ``mute_coin``: the same game, reporting neither, with an ``instructions``
  attribute and no docstring;
* ``line_walk``: an agentgym ``TextEnv``;
* ``forgetful_walk``: a ``TextEnv`` whose ``step`` drops ``action_is_valid``.

:func:`install` runs ``pip install --no-deps --no-build-isolation --target``,
so nothing lands in the project's environment; put the folder on
``sys.path`` (or ``PYTHONPATH``) to use it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN_NAMES = ("coin", "mute_coin", "line_walk", "forgetful_walk")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "agentgym-test-plugins"
version = "0.1.0"
dependencies = ["agentgym"]

[project.entry-points."agentgym.envs"]
coin = "agentgym_test_plugins.coin:CoinEnv"
mute_coin = "agentgym_test_plugins.coin:MuteCoinEnv"
line_walk = "agentgym_test_plugins.walk:LineWalkEnv"
forgetful_walk = "agentgym_test_plugins.walk:ForgetfulWalkEnv"
"""

COIN = '''
import string
from typing import Any

import gymnasium
from gymnasium import spaces


class CoinEnv(gymnasium.Env):
    """Guess the side of a hidden coin: answer heads or tails.

    A right guess earns 1 and ends the episode; anything else is a wrong
    guess (0), or an invalid one when it is neither word.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, length: int = 3, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Text(64, charset=string.printable)
        self.action_space = spaces.Text(256, charset=string.printable)
        self.length = length
        self.render_mode = render_mode
        self.made_with_render_mode = render_mode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.coin = ("heads", "tails")[int(self.np_random.integers(2))]
        self.guesses = 0
        return f"flip 0 of {self.length}", self._flags(valid=True, right=False)

    def step(self, action: str):
        self.guesses += 1
        guess = action.strip().lower()
        right = guess == self.coin
        info = self._flags(valid=guess in ("heads", "tails"), right=right)
        observation = f"flip {self.guesses} of {self.length}"
        return observation, float(right), right, self.guesses >= self.length, info

    def render(self) -> str:
        return f"the coin shows {self.coin}"

    def solve(self) -> list[str]:
        return [self.coin]

    def _flags(self, *, valid: bool, right: bool) -> dict[str, Any]:
        return {"action_is_valid": valid, "success": right}


class MuteCoinEnv(CoinEnv):
    instructions = "Say heads or tails."

    def _flags(self, *, valid: bool, right: bool) -> dict[str, Any]:
        return {"guesses": self.guesses}
'''

WALK = '''
from typing import Any

from agentgym.envs.text_env import TextEnv


class LineWalkEnv(TextEnv):
    """Walk right along a line to reach the end."""

    action_names = ("Left", "Right")

    def __init__(self, *, length: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length = length
        self.position = 0

    def _reset(self, options):
        self.position = 0
        return {}

    def _apply(self, action):
        self.position = max(0, self.position + (1 if action == "Right" else -1))
        done = self.position >= self.length
        return float(done), done

    def _observation(self):
        return "".join("P" if i == self.position else "_" for i in range(self.length + 1))

    def _success(self):
        return self.position >= self.length


class ForgetfulWalkEnv(LineWalkEnv):
    """LineWalk whose step forgets to report action_is_valid."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        del info["action_is_valid"]
        return observation, reward, terminated, truncated, info
'''


def write_package(root: Path) -> Path:
    """Write the plugin package's sources under ``root``; returns its folder."""
    package = root / "agentgym-test-plugins"
    source = package / "src" / "agentgym_test_plugins"
    source.mkdir(parents=True)
    (package / "pyproject.toml").write_text(PYPROJECT)
    (source / "__init__.py").write_text("")
    (source / "coin.py").write_text(textwrap.dedent(COIN))
    (source / "walk.py").write_text(textwrap.dedent(WALK))
    return package


def pip_install(package: Path, target: Path) -> Path:
    """``pip install`` a package folder into ``target`` (no dependencies, no build isolation)."""
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
        "--no-build-isolation", "--target", str(target), str(package),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip install {package} failed:\n{result.stderr}")
    return target


def install(root: Path) -> Path:
    """Build and install ``agentgym-test-plugins`` under ``root``; returns the site folder."""
    return pip_install(write_package(root), root / "site")
