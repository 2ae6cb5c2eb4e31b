"""The text environment base class: observations and actions are strings.

A :class:`TextEnv` is a ``gymnasium.Env[str, str]``. The model's raw text goes
into :meth:`TextEnv.step`; the env parses it into actions of its own
vocabulary. Text that does not parse is a penalized no-op, never an exception.
Envs know nothing about tokens or models.

One turn is two hooks: :meth:`TextEnv._parse` turns the text into a
:class:`~agentgym.envs.parsing.ParsedResponse`, and :meth:`TextEnv._play`
plays it and says what happened in a :class:`TurnResult`. The base class
does the rest (step count, ``max_steps`` truncation, the format penalty,
``info``).

Most envs keep both defaults: they set :attr:`TextEnv.action_names` and
implement :meth:`_reset`, :meth:`_apply` (one action), :meth:`_observation`
and :meth:`_success`; they may override :meth:`_info`, :meth:`_invalid_turn`,
:meth:`_render_rgb` and :attr:`_rules`. Envs whose actions are not a fixed
vocabulary (WebShop's ``search[...]``) override :meth:`_parse`; envs whose
turn is more than a sequence of actions (WebShop checks a whole turn before
playing it, tool envs run tool calls) override :meth:`_play` instead of
:meth:`_apply`.

Tool-use envs declare :attr:`TextEnv.tools` (OpenAI function schemas, handed
to the chat template's ``tools=``) and return the results of the model's tool
calls in ``info["tool_results"]`` (a list of strings, one per call, in order);
the rollout then sends them to the model as ``tool`` messages instead of
sending the observation as a ``user`` message.
"""

from __future__ import annotations

import functools
import inspect
import string
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

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


REQUIRED_INFO = ("action_is_valid", "success")
"""Keys every ``reset`` and ``step`` info of an agentgym env carries."""
_VALID, _SUCCESS = REQUIRED_INFO

CONVERSATION_KEY = "messages"
"""The info key under which an agent-native env hands the model its next prompt: the
whole conversation as chat messages, the env's own (``agent.kind=native``,
:class:`~agentgym.proxy.native.NativePlayer`)."""

_T = TypeVar("_T")


class EnvContractError(TypeError):
    """An env broke agentgym's env contract; the message names the env."""


def check_info(env: gymnasium.Env[Any, Any], info: dict[str, Any], where: str) -> None:
    """Raise unless ``info`` has every key of :data:`REQUIRED_INFO`.

    Args:
        env: The env that returned ``info`` (named in the error).
        info: What its ``reset`` or ``step`` returned.
        where: ``"reset"`` or ``"step"``.

    Raises:
        EnvContractError: Naming the env, the missing keys and the fix.
    """
    if _VALID in info and _SUCCESS in info:  # the usual case, in tens of ns
        return
    missing = [key for key in REQUIRED_INFO if key not in info]
    if missing:
        raise EnvContractError(
            f"{type(env).__module__}.{type(env).__qualname__}.{where}() returned an info "
            f"without {missing}; every agentgym env reports {list(REQUIRED_INFO)} in the "
            f"info of reset and step. Let TextEnv.{where} build the info (override the "
            "_parse/_play hooks instead), or add the keys."
        )


def require_reset(value: _T | None, before: str = "using the env") -> _T:
    """An episode's state that ``reset()`` sets (a room, a task, a database).

    Args:
        value: The state; None until the first ``reset()``.
        before: What needs it, for the message (``"call reset() before ..."``).

    Returns:
        ``value``, no longer optional.

    Raises:
        RuntimeError: If ``value`` is None: a programming error, not model output.
    """
    if value is None:
        raise RuntimeError(f"call reset() before {before}")
    return value


def _checked(method: Callable[..., Any], where: str) -> Callable[..., Any]:
    """Wrap an overridden ``reset``/``step`` so that its info is checked.

    A method with the base class's parameters gets a wrapper with the same parameters:
    passing ``*args, **kwargs`` on costs ~0.2 µs a call, and a fast env's whole step
    (GEM's Guess the Number) is ~3.5 µs.
    """
    parameters = [
        (p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()
    ]
    if where == "step" and parameters == _STEP_PARAMETERS:

        @functools.wraps(method)
        def checked_step(self: TextEnv, action: str) -> Any:
            result = method(self, action)
            check_info(self, result[-1], where)
            return result

        return checked_step
    if where == "reset" and parameters == _RESET_PARAMETERS:

        @functools.wraps(method)
        def checked_reset(
            self: TextEnv, *, seed: int | None = None, options: dict[str, Any] | None = None
        ) -> Any:
            result = method(self, seed=seed, options=options)
            check_info(self, result[-1], where)
            return result

        return checked_reset

    @functools.wraps(method)
    def checked(self: TextEnv, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        check_info(self, result[-1], where)
        return result

    return checked


_P = inspect.Parameter
_STEP_PARAMETERS = [(name, _P.POSITIONAL_OR_KEYWORD, _P.empty) for name in ("self", "action")]
_RESET_PARAMETERS = [
    ("self", _P.POSITIONAL_OR_KEYWORD, _P.empty),
    *((name, _P.KEYWORD_ONLY, None) for name in ("seed", "options")),
]


def text_space() -> spaces.Text:
    """The Gymnasium space of observation and action strings."""
    return spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset="".join(TEXT_CHARSET))


@dataclass(frozen=True)
class TurnResult:
    """What playing one parsed response did.

    Attributes:
        reward: The turn's reward, before the format penalty.
        terminated: Whether the episode ended (goal reached, purchase made, answer given).
        valid: Whether the response was a valid turn; an invalid one also earns
            ``format_penalty``.
        error: Why the turn is invalid (``info["parse_error"]``); None when valid.
        actions: What was played, for ``info["actions"]``.
        steps: Env steps the turn counts for ``max_steps`` (an invalid turn counts one).
        truncated: The env cut the episode short itself (a tool budget used
            up); ``max_steps`` truncation is the base class's.
        info: Info of this turn only (e.g. ``tool_results``), added to ``step``'s info.
    """

    reward: float
    terminated: bool
    valid: bool = True
    error: str | None = None
    actions: tuple[str, ...] = ()
    steps: int = 1
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def invalid(cls, error: str | None, reward: float = 0.0) -> TurnResult:
        """A turn that changed nothing: one step, ``reward`` before the format penalty."""
        return cls(reward=reward, terminated=False, valid=False, error=error)


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

    generator_version: ClassVar[int | None] = None
    """Version of the env's task generator (rooms, catalogs, questions): raised
    whenever the same seed would give a different task. Recorded with the env id."""

    inline_calls: ClassVar[bool] = False
    """True for an env whose ``reset`` and ``step`` are short pure-Python work (well under
    a millisecond, no I/O, no waiting): a rollout in this process then calls them on its
    event loop instead of its thread pool. Such work holds the interpreter lock in a
    thread anyway, so the thread's hand-off is all a pool adds (about 0.1 ms a call on
    2 cores). Leave it False for an env that waits (tools, subprocesses, servers) or
    computes for long, and set it back to False in a subclass of such an env that
    does (a Sokoban whose steps sleep, say)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    """Gymnasium's; a subclass that implements :meth:`_render_rgb` gets ``rgb_array`` too."""

    def __init_subclass__(cls, *, checked_info: bool = True, **kwargs: Any) -> None:
        # The base reset/step always fill REQUIRED_INFO; a subclass that overrides
        # them is held to the same contract (a forgotten key would otherwise read as
        # "valid" or "failed" downstream). A class whose reset and step set every key
        # themselves, on every path, may say so (`class E(TextEnv, checked_info=False)`)
        # and skip the check: ~0.1 µs a call, for envs whose step is a few µs.
        super().__init_subclass__(**kwargs)
        for where in ("reset", "step"):
            if checked_info and where in vars(cls):
                setattr(cls, where, _checked(vars(cls)[where], where))
        # The picture is declared once, by implementing it.
        if "_render_rgb" in vars(cls) and "rgb_array" not in cls.metadata["render_modes"]:
            cls.metadata = {
                **cls.metadata,
                "render_modes": [*cls.metadata["render_modes"], "rgb_array"],
            }

    def __init__(
        self,
        *,
        response_format: str = "answer",
        max_actions_per_turn: int = 1,
        format_penalty: float = -0.1,
        max_steps: int = 100,
        render_mode: str | None = None,
    ) -> None:
        cls = type(self)
        if not self.action_names and cls._parse is TextEnv._parse:
            raise TypeError(
                f"{cls.__name__} must define the class attribute action_names or override _parse"
            )
        if cls._play is TextEnv._play and cls._apply is TextEnv._apply:
            raise TypeError(f"{cls.__name__} must implement _apply (one action) or override _play")
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
        """Parse the model's text (:meth:`_parse`) and play it (:meth:`_play`).

        By default a response that does not parse leaves the env where it is,
        counts as one step, and earns :meth:`_invalid_turn`'s reward plus
        ``format_penalty``; a valid response plays its actions in order,
        stopping early when the episode ends. Any invalid turn earns
        ``format_penalty``; ``max_steps`` truncates.

        Args:
            action: The model's raw response text.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info`` has
            ``action_is_valid``, ``action_is_effective`` (valid, and the state's text
            changed: a move into a wall is valid, not effective), ``success``,
            ``actions`` (the parsed action
            names that were played), ``parse_error`` (None when valid), the
            turn's own info (:attr:`TurnResult.info`, e.g. ``tool_results``)
            and the env's :meth:`_info`.
        """
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        steps_before, state_before = self.num_steps, self._observation()
        turn = self._play(self._parse(action))
        # The default _play counts steps as it goes (so _apply sees the count);
        # whatever a _play did to num_steps, the turn's steps are what count.
        self.num_steps = steps_before + turn.steps
        reward = turn.reward + (0.0 if turn.valid else self.format_penalty)
        truncated = not turn.terminated and (turn.truncated or self.num_steps >= self.max_steps)
        self._done = turn.terminated or truncated
        info: dict[str, Any] = {"parse_error": turn.error, **turn.info}
        observation = self._observation()
        info.update(
            self._info(),
            action_is_valid=turn.valid,
            action_is_effective=turn.valid and observation != state_before,
            actions=list(turn.actions),
            success=self._success(),
        )
        return observation, float(reward), turn.terminated, truncated, info

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

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        """Play a parsed response.

        The default plays the actions one by one through :meth:`_apply`,
        stopping when the episode ends or ``max_steps`` is reached; a response
        that did not parse is a no-op earning :meth:`_invalid_turn`. Override
        it (instead of :meth:`_apply`) when a turn is more than that.

        Args:
            parsed: What :meth:`_parse` made of the model's text.

        Returns:
            What the turn did.
        """
        if not parsed.is_valid:
            return TurnResult.invalid(parsed.error, reward=self._invalid_turn())
        reward, terminated, played = 0.0, False, []
        for name in parsed.actions:
            self.num_steps += 1
            step_reward, terminated = self._apply(name)
            reward += step_reward
            played.append(name)
            if terminated or self.num_steps >= self.max_steps:
                break
        return TurnResult(reward, terminated, actions=tuple(played), steps=max(len(played), 1))

    @abstractmethod
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        """Set up a new episode from ``self.np_random``; return episode info for ``reset``."""

    def _apply(self, action: str) -> tuple[float, bool]:
        """Play one canonical action; return ``(reward, terminated)``.

        Required unless :meth:`_play` is overridden (checked in ``__init__``).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement _apply")

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
