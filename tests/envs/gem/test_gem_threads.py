"""env=gem under threads: GEM's games draw from the global generators, so concurrent
episodes must still give the games that one-at-a-time episodes give; a game's step
goes without the lock only where it draws nothing (``STEPS_WITHOUT_DRAWS``)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import agentgym
from tests.envs.gem.test_gem_env import actions, play

gem = pytest.importorskip("gem")  # make setup installs it (the gem extra)

DRAWLESS = ["game:GuessTheNumber-v0", "game:GuessTheNumber-v0-random"]


@pytest.fixture
def often_switching_threads() -> Iterator[None]:
    """Threads hand the interpreter over every µs: interleavings that a lock must stop."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("env_id", DRAWLESS)
def test_steps_of_drawless_games_leave_both_global_generators_as_they_were(env_id: str) -> None:
    from agentgym.envs.gem.env import STEPS_WITHOUT_DRAWS

    env: Any = agentgym.make("gem", env_id=env_id).unwrapped
    kind = type(env.gem_env)
    assert f"{kind.__module__}.{kind.__qualname__}" in STEPS_WITHOUT_DRAWS
    assert env._step_lock is None
    steps = 0
    for episode in range(200):
        env.reset(seed=episode)
        for action in actions(env_id, episode):
            python_state, numpy_state = random.getstate(), np.random.get_state()
            _, _, terminated, truncated, _ = env.step(action)
            assert random.getstate() == python_state
            after = np.random.get_state()
            assert all(np.array_equal(a, b) for a, b in zip(after, numpy_state, strict=True))
            steps += 1
            if terminated or truncated:
                break
    assert steps > 1000


def test_other_games_step_under_the_lock_unless_told() -> None:
    from agentgym.envs.gem.env import _GLOBAL_RNG

    drawing: Any = agentgym.make("gem", env_id="game:Game2048-v0-easy").unwrapped
    assert drawing._step_lock is _GLOBAL_RNG  # its step places a tile at random
    told: Any = agentgym.make("gem", env_id=DRAWLESS[0], use_thread_lock=True).unwrapped
    assert told._step_lock is _GLOBAL_RNG
    single: Any = agentgym.make("gem", env_id="rg:letter_counting").unwrapped
    assert single._step_lock is None


@pytest.mark.usefixtures("often_switching_threads")
@pytest.mark.parametrize("env_id", DRAWLESS)
def test_concurrent_episodes_play_the_games_of_one_at_a_time(env_id: str) -> None:
    envs = [agentgym.make("gem", env_id=env_id) for _ in range(32)]
    episodes = range(128)
    alone = [play(envs[0], env_id, episode) for episode in episodes]

    def played(episode: int) -> list[tuple[Any, ...]]:
        return play(envs[episode % len(envs)], env_id, episode)

    for _ in range(2):
        with ThreadPoolExecutor(max_workers=len(envs)) as pool:
            # one env per worker at a time: episode e and e + 32 share an env, so
            # they run in turn (a wave of 32 is awaited before the next)
            together: list[list[tuple[Any, ...]]] = []
            for wave in range(0, len(episodes), len(envs)):
                together += pool.map(played, episodes[wave : wave + len(envs)])
        assert together == alone
