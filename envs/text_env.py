"""The text environment base class: observations and actions are strings.

A :class:`TextEnv` is a ``gymnasium.Env[str, str]``. The model's raw text goes
into :meth:`TextEnv.step`; the env parses it into actions of its own
vocabulary. Text that does not parse is a penalized no-op, never an exception.
Envs know nothing about tokens or models.

Subclasses set :attr:`TextEnv.action_names` and implement four hooks:
:meth:`_reset`, :meth:`_apply`, :meth:`_observation` and :meth:`_success`;
they may override :meth:`_info`, :meth:`_invalid_turn`, :meth:`_render_rgb`
and :attr:`_rules`. Envs whose actions are not a fixed vocabulary (WebShop's
``search[...]``) override :meth:`_parse` instead of setting ``action_names``.

Tool-use envs declare :attr:`TextEnv.tools` (OpenAI function schemas, handed
to the chat template's ``tools=``) and return the results of the model's tool
calls in ``info["tool_results"]`` (a list of strings, one per call, in order);
the rollout then sends them to the model as ``tool`` messages instead of
sending the observation as a ``user`` message.
"""

from __future__ import annotations

import inspect
import string
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces

from agentgym.envs.parsing import (
    RESPONSE_FORMATS,
    ParsedResponse,
    format_instructions,
    parse_response,
)

TEXT_CHARSET = frozenset(string.printable) | frozenset("√·█░→←↑↓")
"""Characters that may appear in observations and actions of the spaces below."""

MAX_TEXT_LENGTH = 1 << 16


def text_space() -> spaces.Text:
    """The Gymnasium space of observation and action strings."""
    return spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset="".join(TEXT_CHARSET))


class TextEnv(gymnasium.Env[str, str], ABC):
    """Base class of agentgym's environments.

    Args:
        response_format: ``"answer"`` (``<answer>Up</answer>``) or
            ``"think_answer"`` (``<think>...</think><answer>Up</answer>``).
        max_actions_per_turn: The most actions one response may hold,
            separated by ``||``.
        format_penalty: Added to the reward of a turn whose text does not parse
            (usually negative).
        max_steps: Episode length limit in env steps; an invalid turn counts
            as one step. The episode is truncated when it is reached.
        render_mode: ``"ansi"`` or ``"rgb_array"`` (where the env has a
            picture), or None.
    """

    action_names: ClassVar[tuple[str, ...]] = ()
    """The action vocabulary, in canonical spelling; matched case-insensitively."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        *,
        response_format: str = "answer",
        max_actions_per_turn: int = 1,
        format_penalty: float = -0.1,
        max_steps: int = 100,
        render_mode: str | None = None,
    ) -> None:
        if not self.action_names and type(self)._parse is TextEnv._parse:
            raise TypeError(
                f"{type(self).__name__} must define the class attribute action_names "
                "or override _parse"
            )
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(
                f"response_format={response_format!r} is not supported; "
                f"valid options: {list(RESPONSE_FORMATS)}"
            )
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn must be >= 1, got {max_actions_per_turn}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported by {type(self).__name__}; "
                f"valid options: {self.metadata['render_modes']}"
            )
        self.response_format = response_format
        self.max_actions_per_turn = max_actions_per_turn
        self.format_penalty = float(format_penalty)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        self.num_steps = 0
        self._done = False

    # -- public API -------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas (empty for envs without tools)."""
        return []

    @property
    def instructions(self) -> str:
        """The rules, the symbols and the expected answer format, for a system prompt."""
        actions = ", ".join(self.action_names)
        answer_format = format_instructions(
            self.response_format, self.action_names[0], self.max_actions_per_turn
        )
        return f"{self._rules}\nValid actions: {actions}.\n{answer_format}"

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: Seeds the env's generator; the same seed gives the same
                episode on any machine. None continues the current generator.
            options: Env-specific reset options.

        Returns:
            The first observation text and an info dict with ``success``,
            ``action_is_valid`` (True) and ``actions`` (empty).
        """
        super().reset(seed=seed)
        self.num_steps = 0
        self._done = False
        info = self._reset(options or {})
        info.update(self._info(), action_is_valid=True, actions=[], success=self._success())
        return self._observation(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Parse the model's text and play the actions it names.

        A response that does not parse leaves the env where it is, counts as
        one step, and earns :meth:`_invalid_turn`'s reward plus
        ``format_penalty``. A valid response plays its actions in order,
        stopping early when the episode ends.

        Args:
            action: The model's raw response text.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info`` has
            ``action_is_valid``, ``success``, ``actions`` (the parsed action
            names that were played), ``parse_error`` (None when valid) and
            the env's :meth:`_info`.
        """
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        parsed = self._parse(action)
        info: dict[str, Any] = {"parse_error": parsed.error}
        terminated = truncated = False
        played: list[str] = []
        if parsed.is_valid:
            reward = 0.0
            for name in parsed.actions:
                self.num_steps += 1
                step_reward, terminated = self._apply(name)
                reward += step_reward
                played.append(name)
                truncated = not terminated and self.num_steps >= self.max_steps
                if terminated or truncated:
                    break
        else:
            self.num_steps += 1
            reward = self._invalid_turn() + self.format_penalty
            truncated = self.num_steps >= self.max_steps
        self._done = terminated or truncated
        info.update(
            self._info(), action_is_valid=parsed.is_valid, actions=played, success=self._success()
        )
        return self._observation(), float(reward), terminated, truncated, info

    def render(self) -> Any:
        """Render the current state: text for ``"ansi"``, an RGB array for ``"rgb_array"``."""
        if self.render_mode == "rgb_array":
            return self._render_rgb()
        return self._observation()

    # -- hooks ------------------------------------------------------------------

    @property
    def _rules(self) -> str:
        """The env's rules and symbols, without the answer format.

        Defaults to the first paragraph of the class docstring.
        """
        doc = inspect.cleandoc(type(self).__doc__ or type(self).__name__)
        return doc.split("\n\n", 1)[0]

    def _parse(self, text: str) -> ParsedResponse:
        """Parse the model's raw text into canonical actions for :meth:`_apply`.

        The default matches :attr:`action_names` in the configured response
        format; it must never raise on model output.
        """
        return parse_response(
            text,
            self.action_names,
            response_format=self.response_format,
            max_actions=self.max_actions_per_turn,
        )

    @abstractmethod
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        """Set up a new episode from ``self.np_random``; return episode info for ``reset``."""

    @abstractmethod
    def _apply(self, action: str) -> tuple[float, bool]:
        """Play one canonical action; return ``(reward, terminated)``."""

    @abstractmethod
    def _observation(self) -> str:
        """The current state as text."""

    @abstractmethod
    def _success(self) -> bool:
        """Whether the episode's goal is reached."""

    def _info(self) -> dict[str, Any]:
        """State info added to every ``reset`` and ``step`` info (valid turn or not)."""
        return {}

    def _invalid_turn(self) -> float:
        """Reward of a turn whose text did not parse, before the format penalty."""
        return 0.0

    def _render_rgb(self) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} has no rgb_array rendering")
