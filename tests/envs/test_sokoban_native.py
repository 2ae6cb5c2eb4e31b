"""sokoban_native: ROLL's SokobanNativeEnv conversation on agentgym's Sokoban."""

from __future__ import annotations

import agentgym
from agentgym.envs.sokoban import SokobanEnv
from agentgym.envs.sokoban.native import OBSERVATION_SUFFIX, SokobanNativeEnv
from agentgym.envs.text_env import CONVERSATION_KEY

# ROLL's texts, written out (roll/pipeline/agentic/env/sokoban/native_env.py and env.py)
ROLL_SYSTEM = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high "
    "reward in the game.\n\nYou are solving the Sokoban puzzle. You are the player and you "
    "need to push all boxes to targets. When you are right next to a box, you can push it by "
    "moving in the same direction. You cannot push a box through a wall, and you cannot pull "
    "a box. The answer must be one of action in a turn, format is <answer>Right</answer>.\n"
    "The meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on "
    "target, X: box, P: player, S: player on target\nYour available actions are:\n"
    "Up, Down, Left, Right"
)
ROLL_SUFFIX = (
    "\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of '<answer> "
    "[your answer] </answer>',  with no extra text, eg. <answer>Right</answer>.\nYour "
    "available actions are:\nUp, Down, Left, Right\n. </system-reminder>\n\nDecide the next "
    "action:\n"
)


def test_the_conversation_is_rolls_and_the_game_is_sokobans() -> None:
    native = agentgym.make("sokoban_native", max_steps=5, search_depth=3).unwrapped
    plain = SokobanEnv(max_steps=5, search_depth=3, dim_room=(6, 6), num_boxes=1)
    assert isinstance(native, SokobanNativeEnv) and OBSERVATION_SUFFIX == ROLL_SUFFIX
    observation, info = native.reset(seed=11)
    board, _ = plain.reset(seed=11)
    assert observation == f"Here is the current state:\n{board}\n\n{ROLL_SUFFIX}"
    assert info[CONVERSATION_KEY] == [
        {"role": "system", "content": ROLL_SYSTEM},
        {"role": "user", "content": observation},
    ]
    assert native.instructions == ROLL_SYSTEM
    for action in [
        "<answer>Up</answer>",
        "<answer>Left</answer>",
        "go left",
        "<answer>Down</answer>",
    ]:
        observation, reward, terminated, truncated, info = native.step(action)
        board, plain_reward, *ends, plain_info = plain.step(action)
        assert (reward, [terminated, truncated]) == (plain_reward, ends)
        assert info["action_is_valid"] == plain_info["action_is_valid"]
        state = f"Current state:\n{board}\n\n{ROLL_SUFFIX}"
        if info["action_is_valid"]:
            assert observation == state
        else:  # the reminder ROLL means to show (its own test of it never passes)
            assert observation.startswith("\n\n<system-reminder>\n(IMPORTANT TIPS: the last")
            assert observation.endswith(state) and reward == -0.1 + native.format_penalty
        assert info[CONVERSATION_KEY][-2:] == [
            {"role": "assistant", "content": action},
            {"role": "user", "content": observation},
        ]
    assert len(info[CONVERSATION_KEY]) == 2 + 2 * 4
    info[CONVERSATION_KEY].clear()  # a copy: the env's own is untouched
    assert len(native.messages) == 10


def test_rolls_arguments_reach_the_prompts() -> None:
    env = SokobanNativeEnv(system_template="Play well.", observation_suffix="Move:")
    observation, info = env.reset(seed=0)
    assert info[CONVERSATION_KEY][0]["content"].startswith("Play well.\n\nYou are solving")
    assert observation.endswith("\n\nMove:")
    assert (env.max_steps, env.search_depth) == (10, 300)  # ROLL's native env's defaults
