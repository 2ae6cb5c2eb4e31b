"""env=gem: GEM's envs through agentgym give exactly what GEM gives on the same actions;
unknown ids and hub datasets without a local copy are config errors that say what to do."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import agentgym
from agentgym.errors import ConfigError

gem = pytest.importorskip("gem")  # make setup installs it (the gem extra)

EPISODES = 200


def actions(env_id: str, episode: int) -> list[str]:
    """A seeded mix of guesses, repeats, out-of-range numbers and unreadable text."""
    rng = np.random.default_rng(episode)
    if env_id.startswith("rg:"):
        return [f"The count is \\boxed{{{int(rng.integers(0, 4))}}}"]
    pool = [f"I guess \\boxed{{{int(n)}}}" for n in rng.integers(0, 23, size=12)]
    if episode % 7 == 0:
        pool[int(rng.integers(0, 3))] = "no idea"
    return pool


def play(env: Any, env_id: str, episode: int) -> list[tuple[Any, ...]]:
    observation, _ = env.reset(seed=episode)
    record: list[tuple[Any, ...]] = [(observation,)]
    for action in actions(env_id, episode):
        observation, reward, terminated, truncated, _ = env.step(action)
        record.append((observation, float(reward), bool(terminated), bool(truncated)))
        if terminated or truncated:
            break
    return record


@pytest.mark.parametrize("env_id", ["game:GuessTheNumber-v0", "rg:letter_counting"])
def test_observations_and_rewards_equal_gems_own_on_the_same_actions(env_id: str) -> None:
    from agentgym.envs.gem.ids import gem_registry

    gem_registry()  # GEM 0.0.4's game:GuessTheNumber-v0 (ROLL's id) registered too
    direct = gem.make(env_id)
    ours = agentgym.make("gem", env_id=env_id)
    theirs = [play(direct, env_id, episode) for episode in range(EPISODES)]
    mine = [play(ours, env_id, episode) for episode in range(EPISODES)]
    assert mine == theirs
    rewards = {step[1] for episode in theirs for step in episode[1:]}
    assert {0.0, 1.0} <= rewards  # both outcomes are compared, not one
    if env_id.startswith("game:"):
        assert -0.1 in rewards and len({len(e) for e in theirs}) > 3  # bad text, lengths vary


def test_success_and_validity_flags_follow_gems_rewards() -> None:
    env = agentgym.make("gem", env_id="game:GuessTheNumber-v0-easy")  # 1..10, 4 turns
    env.reset(seed=0)
    target = env.unwrapped.gem_env.game_number  # type: ignore[attr-defined]
    _, reward, terminated, _, info = env.step(f"\\boxed{{{target}}}")
    assert (reward, terminated, info["success"], info["action_is_valid"]) == (1.0, True, True, True)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("I pass")
    assert (reward, terminated, info["success"], info["action_is_valid"]) == (
        -0.1,
        True,
        False,
        False,
    )


def test_np_random_and_its_seed_are_gymnasiums_after_each_seeded_reset() -> None:
    # the generator is made lazily (a game's step is a few µs); what it reports is not
    env = agentgym.make("gem", env_id="game:GuessTheNumber-v0").unwrapped
    for seed in (5, 7):
        env.reset(seed=seed)
        assert env.np_random_seed == seed
        assert env.np_random.integers(1 << 30) == np.random.default_rng(seed).integers(1 << 30)


def test_an_unknown_id_names_the_close_one() -> None:
    with pytest.raises(ConfigError, match=r"'game:GuessTheNumbr-v0' is not a GEM env id\. Did you "
                       r"mean 'game:GuessTheNumber-v0'\?"):  # fmt: skip
        agentgym.make("gem", env_id="game:GuessTheNumbr-v0")


def test_a_hub_dataset_without_a_local_copy_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as error:
        agentgym.make("gem", env_id="math:GSM8K")  # GEM's axon-rl/GSM-8k
    assert str(error.value).startswith(
        "math:GSM8K's dataset_name='axon-rl/GSM-8k' is a hub dataset id, and this env reads "
        "its data from a local copy: give a .jsonl, .json or .parquet file, or a datasets folder"
    )
    with pytest.raises(ConfigError, match=r"^env.kwargs.dataset_name='open-r1/DAPO-Math-17k-P"):
        agentgym.make("gem", env_id="math:GSM8K", dataset_name="open-r1/DAPO-Math-17k-Processed")


def test_a_local_file_stands_for_the_hub_dataset_and_gems_grader_scores(tmp_path: Path) -> None:
    rows = [{"problem": "What is half of one?", "answer": "0.5"}]
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env = agentgym.make("gem", env_id="math:GSM8K", dataset_name=str(path))
    try:
        observation, _ = env.reset(seed=3)
        assert observation == "What is half of one?"
        _, reward, terminated, truncated, info = env.step(r"so \boxed{\frac{1}{2}}")
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, True, True)
    finally:
        env.close()


def _game_ids() -> list[str]:
    from agentgym.envs.gem.ids import gem_registry

    gem_registry()
    from gem.envs.registration import ENV_REGISTRY

    left_out = (
        "Sudoku",  # its resets search for a board: up to 0.5 s each
        "Sokoban",  # 5-13 ms each
        "Hangman",  # these three need NLTK's word list, which is not here
        "Wordle",
        "WordSearch",
    )
    broken = {"game:Crosswords-v0-random", "game:FifteenPuzzle-v0-random"}  # gem-llm 0.1's
    return sorted(
        i
        for i in ENV_REGISTRY
        if i.startswith("game:") and i not in broken and not i[5:].startswith(left_out)
    )


def test_gems_games_answer_with_a_dict_of_their_own_and_the_types_the_adapter_passes_on() -> None:
    """What ``OWN_RESULTS`` rests on, for GEM's game ids (but the slow and the word
    games, read in the source to answer the same way): a new info dict from every call,
    held by nobody else, without the flags the adapter adds, and str/float/bool."""
    from agentgym.envs.gem.env import OWN_RESULTS

    made, steps = 0, 0
    for env_id in _game_ids():
        env = gem.make(env_id)
        made += 1
        assert type(env).__module__.startswith(OWN_RESULTS), env_id
        for episode in range(3):
            observation, info = env.reset(seed=episode)
            assert type(observation) is str and type(info) is dict
            assert sys.getrefcount(info) == 2, env_id  # this name and the call's argument
            earlier = info
            for action in actions("game:", episode)[:6]:
                observation, reward, terminated, truncated, info = env.step(action)
                assert info is not earlier and sys.getrefcount(info) == 2, env_id
                assert not {"correct", "success", "action_is_valid"} & info.keys(), env_id
                assert type(observation) is str and type(reward) is float, (env_id, reward)
                assert type(terminated) is bool and type(truncated) is bool, env_id
                earlier, steps = info, steps + 1
                if terminated or truncated:
                    break
    assert made >= 20 and steps > 100
