"""Sokoban as an agent-native env: the env owns the conversation (ROLL's ``sokoban_native_env``).

An agent-native env keeps the whole conversation itself and hands the model its next
prompt as chat messages, in the info of every ``reset`` and ``step`` under
:data:`~agentgym.envs.text_env.CONVERSATION_KEY`. ``agent.kind=native``
(:class:`~agentgym.proxy.native.NativePlayer`, ROLL's ``AgentNativeStepEnvManager``)
renders those messages as each step's prompt, one training sample per step. Played by
the env manager's own loop, the env is a plain Sokoban whose observation is the user
message it would add (the same conversation, kept by the loop).
"""

from __future__ import annotations

from typing import Any

from agentgym.envs.sokoban.env import SokobanEnv
from agentgym.envs.sokoban.room import ACTIONS
from agentgym.envs.text_env import CONVERSATION_KEY

SYSTEM_TEMPLATE = (
    "You're a helpful assistant. You are a good game player. "
    "You are aiming to get high reward in the game."
)
"""ROLL's default ``system_template`` of the native env."""

ENV_INSTRUCTION = (
    "You are solving the Sokoban puzzle. "
    "You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The answer must be one of action in a turn, format is <answer>Right</answer>."
)
"""ROLL's Sokoban ``env_instruction``."""

GRID_VOCAB = {
    "#": "wall",
    "_": "empty",
    "O": "target",
    "√": "box on target",
    "X": "box",
    "P": "player",
    "S": "player on target",
}
"""ROLL's Sokoban symbol meanings, in its order."""

_ACTIONS_LINE = "\nYour available actions are:\n" + ", ".join(ACTIONS)

OBSERVATION_SUFFIX = (
    "\n\n<system-reminder>\nIMPORTANT: Ensure that your response is the format of "
    "'<answer> [your answer] </answer>',  with no extra text, eg. <answer>Right</answer>."
    f"{_ACTIONS_LINE}\n. </system-reminder>\n\nDecide the next action:\n"
)
"""ROLL's default ``observation_suffix``, after every state."""

INVALID_REMINDER = (
    "\n\n<system-reminder>\n(IMPORTANT TIPS: the last action is not valid, your new "
    "response *must* strictly adhere to the format according system-reminder.)"
    "</system-reminder>\n\n"
)
"""Put before the state that follows an invalid action."""


class SokobanNativeEnv(SokobanEnv):
    """Sokoban whose conversation the env keeps (ROLL's ``SokobanNativeEnv``).

    The system message is ROLL's ``system_template`` and its Sokoban instructions; the
    first user message ``Here is the current state:`` and the room, later ones
    ``Current state:``, each followed by ``observation_suffix``; the model's text comes
    back as the assistant message. Dynamics, rewards and rooms are :class:`SokobanEnv`'s
    (gym-sokoban's rewards; ``format_penalty`` on a turn that does not parse). Every
    ``reset`` and ``step`` info holds the conversation so far under
    :data:`~agentgym.envs.text_env.CONVERSATION_KEY` (a fresh copy each time).

    One difference from ROLL: the reminder that the last action was not valid comes
    before the state after an invalid action. ROLL's env tests a key its base env never
    sets at the top level of ``info`` (``action_is_valid`` lives in ``info["metrics"]``
    there), so ROLL never shows it.

    Args:
        system_template: The system message's first paragraph (ROLL's default:
            :data:`SYSTEM_TEMPLATE`).
        observation_suffix: The text after each state (ROLL's default:
            :data:`OBSERVATION_SUFFIX`).
        search_depth: As :class:`SokobanEnv` (ROLL's native env's default: 300).
        max_steps: As :class:`SokobanEnv` (ROLL's native env's default: 10).
        **kwargs: :class:`SokobanEnv` options (``dim_room``, ``num_boxes``,
            ``format_penalty``, ...).
    """

    def __init__(
        self,
        *,
        system_template: str | None = None,
        observation_suffix: str | None = None,
        search_depth: int = 300,
        max_steps: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(search_depth=search_depth, max_steps=max_steps, **kwargs)
        self.system_template = SYSTEM_TEMPLATE if system_template is None else system_template
        self.observation_suffix = (
            OBSERVATION_SUFFIX if observation_suffix is None else observation_suffix
        )
        self.messages: list[dict[str, str]] = []

    @property
    def instructions(self) -> str:
        """ROLL's system message: the template, then the rules, symbols and actions."""
        vocab = ", ".join(f"{symbol}: {meaning}" for symbol, meaning in GRID_VOCAB.items())
        rules = f"{ENV_INSTRUCTION}\nThe meaning of each symbol in the state is:\n{vocab}"
        return f"{self.system_template}\n\n{rules}{_ACTIONS_LINE}"

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode: the observation is the first user message; ``info`` holds
        the system and user messages under ``CONVERSATION_KEY``."""
        board, info = super().reset(seed=seed, options=options)
        user = f"Here is the current state:\n{board}\n\n{self.observation_suffix}"
        self.messages = [
            {"role": "system", "content": self.instructions},
            {"role": "user", "content": user},
        ]
        return user, {**info, CONVERSATION_KEY: self._conversation()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play the model's text; the observation is the next user message, and
        ``info[CONVERSATION_KEY]`` the conversation with the response and that message."""
        board, reward, terminated, truncated, info = super().step(action)
        user = f"Current state:\n{board}\n\n{self.observation_suffix}"
        if not info["action_is_valid"]:
            user = INVALID_REMINDER + user
        self.messages += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": user},
        ]
        return user, reward, terminated, truncated, {**info, CONVERSATION_KEY: self._conversation()}

    def _conversation(self) -> list[dict[str, str]]:
        return [dict(message) for message in self.messages]
