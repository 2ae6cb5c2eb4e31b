"""Any Gymnasium text env as an agentgym :class:`~agentgym.envs.text_env.TextEnv`.

A ``gymnasium.Env`` whose observation and action spaces are ``spaces.Text``
is played, evaluated and trained without subclassing ``TextEnv``:
:func:`make_text_env` wraps it in a :class:`GymTextEnv`, which supplies what
the rollout needs (instructions, the model's text as the action, the
``action_is_valid`` and ``success`` flags). A ``TextEnv`` is returned as it is.

The entry points (``agentgym.train``, ``agentgym.eval``, ``agentgym.play``)
make every env through :func:`make_text_env`.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium
from gymnasium import spaces

from agentgym import registry
from agentgym.envs.parsing import ParsedResponse, format_instructions, parse_free_response
from agentgym.envs.text_env import REQUIRED_INFO, TextEnv, TurnResult

ADAPTER_OPTIONS = ("instructions", "response_format", "format_penalty", "max_steps")
"""Arguments :func:`make_text_env` gives the adapter instead of a plain env (when
the env's constructor does not take them itself)."""

UNREPORTED = "unreported_info"
"""``info`` key: which of :data:`REQUIRED_INFO` the wrapped env left out (defaults used)."""

_NO_STEP_LIMIT = 2**62


class GymTextEnv(TextEnv):
    """A ``gymnasium.Env`` with ``Text`` spaces, seen as a :class:`TextEnv`.

    * **Instructions** (the system prompt): the ``instructions`` argument
      (``env.kwargs.instructions`` in a config), else the env's
      ``instructions`` attribute, else its class docstring.
    * **Actions**: the model's raw text goes to the wrapped env's ``step``.
      With ``response_format`` (``"answer"`` or ``"think_answer"``), the text
      inside ``<answer>`` goes instead, and a response that does not follow
      the format is an invalid turn the wrapped env never sees.
    * **info**: the wrapped env's, with ``action_is_valid`` and ``success``
      taken from it; where it leaves them out, the action counts as valid,
      the episode as not solved, and ``info["unreported_info"]`` names the
      missing keys (a warning says so once).
    * Rewards, termination, truncation, seeding and rendering are the wrapped
      env's. Public attributes the adapter lacks (``solve()``,
      ``oracle_response()``) are the wrapped env's too.

    Args:
        env: The env to adapt.
        instructions: The system prompt; overrides the env's own.
        response_format: None (raw text, the default), ``"answer"`` or ``"think_answer"``.
        format_penalty: Added to the reward of an invalid turn (0 by default:
            the wrapped env's rewards are left as they are).
        max_steps: A step limit on top of the wrapped env's own; None for none.

    Raises:
        TypeError: If the env's spaces are not ``Text``, or it has no instructions.
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any],
        *,
        instructions: str | None = None,
        response_format: str | None = None,
        format_penalty: float = 0.0,
        max_steps: int | None = None,
    ) -> None:
        name = type(env).__qualname__
        if not (
            isinstance(env.observation_space, spaces.Text)
            and isinstance(env.action_space, spaces.Text)
        ):
            raise TypeError(
                f"{name} is not a text env: its observation space is {env.observation_space} "
                f"and its action space {env.action_space}; agentgym plays envs whose spaces "
                "are both gymnasium.spaces.Text (or subclasses of agentgym's TextEnv)"
            )
        self.env = env
        self.metadata = {"render_modes": [], **env.metadata}
        super().__init__(
            response_format=response_format or "answer",
            format_penalty=format_penalty,
            max_steps=_NO_STEP_LIMIT if max_steps is None else max_steps,
            render_mode=env.render_mode,
        )
        self.answer_format = response_format
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self._instructions = _instructions(env, instructions)
        self._seed: int | None = None
        self._last_observation = ""
        self._last_info: dict[str, Any] = {}
        self._warned = False

    @property
    def instructions(self) -> str:
        """The env's instructions, and the answer format when one is asked for."""
        if self.answer_format is None:
            return self._instructions
        answer = format_instructions(self.answer_format, "your action", 1)
        return f"{self._instructions}\n{answer}"

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset the wrapped env with exactly this seed and these options."""
        self._seed = seed
        return super().reset(seed=seed, options=options)

    def render(self) -> Any:
        """The wrapped env's rendering."""
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    # -- TextEnv hooks ------------------------------------------------------------

    def _parse(self, text: str) -> ParsedResponse:
        if self.answer_format is None:
            return ParsedResponse(actions=(text,), is_valid=True)
        return parse_free_response(text, response_format=self.answer_format)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        observation, info = self.env.reset(seed=self._seed, options=options or None)
        return self._take(observation, info)

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        if not parsed.is_valid:
            return TurnResult.invalid(parsed.error)
        observation, reward, terminated, truncated, info = self.env.step(parsed.actions[0])
        info = self._take(observation, info)
        return TurnResult(
            float(reward),
            bool(terminated),
            valid=bool(info.get("action_is_valid", True)),
            actions=parsed.actions,
            truncated=bool(truncated),
            info=info,
        )

    def _observation(self) -> str:
        return self._last_observation

    def _success(self) -> bool:
        return bool(self._last_info.get("success", False))

    def _info(self) -> dict[str, Any]:
        return {UNREPORTED: [key for key in REQUIRED_INFO if key not in self._last_info]}

    def _take(self, observation: Any, info: Mapping[str, Any]) -> dict[str, Any]:
        """Keep the wrapped env's latest observation and info; note the flags it left out."""
        self._last_observation = str(observation)
        self._last_info = dict(info)
        missing = [key for key in REQUIRED_INFO if key not in info]
        if missing and not self._warned:
            self._warned = True
            warnings.warn(
                f"{type(self.env).__qualname__} leaves {missing} out of its info: every "
                "action counts as valid and no episode as solved; info['unreported_info'] "
                "marks such turns",
                stacklevel=3,
            )
        return dict(info)


def _instructions(env: gymnasium.Env[Any, Any], given: str | None) -> str:
    if given:
        return given
    own = getattr(env, "instructions", None)
    if isinstance(own, str) and own.strip():
        return own
    doc = type(env).__doc__
    if doc and doc.strip():
        return inspect.cleandoc(doc)
    raise TypeError(
        f"{type(env).__qualname__} has no instructions for the model's system prompt: give it "
        "an `instructions` attribute or a class docstring, or pass instructions "
        "(env.kwargs.instructions=... in a config)"
    )


def make_text_env(
    name: str, kwargs: Mapping[str, Any] | None = None, *, render_mode: str | None = None
) -> TextEnv:
    """Make any text env as a :class:`TextEnv`: an agentgym env as it is, a plain one adapted.

    Args:
        name: A registered short name, an agentgym id, or any Gymnasium id.
        kwargs: Constructor arguments. For a plain Gymnasium env, those of
            :data:`ADAPTER_OPTIONS` that its constructor does not take go to
            :class:`GymTextEnv`.
        render_mode: Passed to the constructor when the env supports it (as
            Gymnasium does), else ignored.

    Returns:
        The env, unwrapped.

    Raises:
        UnknownEnvError: If the name is unknown (with close matches).
        PluginError: If a plugin fails to load.
        TypeError: If the env is not a text env.
    """
    arguments = dict(kwargs or {})
    found = registry.spec(name)
    creator = registry.env_creator(found)
    if render_mode is not None and render_mode in _render_modes(creator):
        arguments["render_mode"] = render_mode
    options: dict[str, Any] = {}
    if not (isinstance(creator, type) and issubclass(creator, TextEnv)):
        accepted = registry.constructor_arguments(found)
        options = {
            k: arguments.pop(k) for k in ADAPTER_OPTIONS if k in arguments and k not in accepted
        }
    env = registry.make(name, **arguments).unwrapped
    if isinstance(env, TextEnv):
        return env
    return GymTextEnv(env, **options)


def _render_modes(creator: Any) -> list[str]:
    metadata = getattr(creator, "metadata", None)
    return list(metadata.get("render_modes", [])) if isinstance(metadata, Mapping) else []
