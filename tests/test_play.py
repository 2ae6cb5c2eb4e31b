"""``python -m agentgym.play``: close matches, commands that are never sent, arrow keys."""

from __future__ import annotations

import io
import string

import gymnasium
import pytest
from gymnasium import spaces

from agentgym.envs.adapter import GymTextEnv, make_text_env
from agentgym.envs.text_env import TextEnv
from agentgym.play import arrow_actions, misspelled, play, to_response


def session(env: TextEnv, typed: str, seed: int = 3) -> str:
    out = io.StringIO()
    play(env, seed, io.StringIO(typed), out)
    return out.getvalue()


class Recorder:
    """Wraps an env's step to record what play() sends."""

    def __init__(self, env: TextEnv) -> None:
        self.sent: list[str] = []
        step = env.step

        def recording(text: str):
            self.sent.append(text)
            return step(text)

        env.step = recording  # type: ignore[method-assign,assignment]


def test_a_misspelled_action_gets_its_close_match_before_it_is_sent() -> None:
    env = make_text_env("sokoban")
    recorder = Recorder(env)
    output = session(env, "rigth\n\nrigth\nn\nlft\ny\n:q\n")
    assert output.count("'rigth' is not an action. Did you mean 'Right'? [Y/n]") == 2
    assert "'lft' is not an action. Did you mean 'Left'? [Y/n]" in output
    # Enter takes the match, n sends what was typed, y takes it.
    assert recorder.sent == [
        "<answer>Right</answer>",
        "<answer>rigth</answer>",
        "<answer>Left</answer>",
    ]
    assert "(invalid: unknown action 'rigth'" in output


def test_misspelled_finds_each_part_of_a_multi_action_line() -> None:
    env = make_text_env("sokoban")
    assert misspelled("Up || dwon || jump", env) == [("dwon", "Down"), ("jump", None)]
    assert misspelled("UP || left", env) == []
    assert misspelled("<answer>dwon</answer>", env) == []  # full responses are sent as typed


def test_commands_are_listed_and_never_sent() -> None:
    env = make_text_env("frozen_lake")
    recorder = Recorder(env)
    output = session(env, ":help\n:hint\n:nope\n:reset\n:q\n", seed=0)
    assert recorder.sent == []
    for command in (":help", ":hint", ":reset", ":q"):
        assert f"  {command}" in output
    assert "unknown command ':nope'; :help lists the commands (nothing was sent)" in output
    assert "plan: [" in output and "[seed 1]" in output


def test_arrow_keys_are_the_four_moves_in_grid_envs() -> None:
    sokoban = make_text_env("sokoban")
    assert arrow_actions("\x1b[A\x1b[B\x1b[C\x1b[D", sokoban) == ["Up", "Down", "Right", "Left"]
    assert arrow_actions("\x1b[A x", sokoban) is None
    assert arrow_actions("\x1b[A", make_text_env("math_tool")) is None  # no grid moves there
    recorder = Recorder(sokoban)
    session(sokoban, "\x1b[C\x1b[A\n:q\n")
    assert recorder.sent == ["<answer>Right</answer>", "<answer>Up</answer>"]


def test_arrows_play_a_room_to_the_end() -> None:
    env = make_text_env("sokoban")
    env.reset(seed=3)
    plan = env.solve()  # type: ignore[attr-defined]
    keys = {"Up": "\x1b[A", "Down": "\x1b[B", "Right": "\x1b[C", "Left": "\x1b[D"}
    output = session(env, "".join(keys[a] for a in plan) + "\n:q\n")
    assert "episode over: solved" in output and "[seed 4]" in output


class Echo(gymnasium.Env[str, str]):
    """Say anything; it is echoed back."""

    observation_space = spaces.Text(64, charset=string.printable)
    action_space = spaces.Text(64, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say something", {}

    def step(self, action):
        return f"you said {action!r}", 0.0, False, False, {}


def test_plain_gymnasium_envs_get_the_typed_text() -> None:
    env = GymTextEnv(Echo())
    assert to_response("  heads  ", env) == "  heads  "
    with pytest.warns(UserWarning, match="leaves"):
        output = session(env, "hello world\n:q\n")
    assert "you said 'hello world'" in output
    asked = GymTextEnv(Echo(), response_format="answer")
    assert to_response("heads", asked) == "<answer>heads</answer>"
