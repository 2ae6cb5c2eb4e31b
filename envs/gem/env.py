"""``gem``: any env of GEM (the ``gem-llm`` package) as an agentgym :class:`TextEnv`.

``gem.make(env_id, **kwargs)`` builds the env; reset and step pass through unchanged:
the observation is GEM's text, the reward, ``terminated`` and ``truncated`` are GEM's
(a single-turn GEM env ends with both True), and GEM's info is kept, with the flags
every agentgym env reports added (``action_is_valid``: GEM's own where it reports one,
else True, for GEM's envs parse the response themselves and answer a malformed one with
their own penalty, except that a game's format-error reward marks the turn
invalid; ``success``: GEM's ``correct`` where it reports it, else whether the
episode ended on a reward of at least 1). The model's whole response is GEM's action:
GEM reads ``\\boxed{}`` or ``<answer>`` itself.

GEM's envs draw from Python's and NumPy's global generators (``reset(seed)`` seeds
them), so a reset, and a step of a game (but one of a game whose step draws nothing,
:data:`STEPS_WITHOUT_DRAWS`), runs under one process-wide lock (ROLL's
``use_thread_lock``): concurrent episodes then give the same games as one at a time.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

from agentgym.envs.gem.data import local_dataset
from agentgym.envs.gem.ids import check_id
from agentgym.envs.gem.tools import ToolWrapperConfig, wrap_with_tools
from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import MAX_TEXT_LENGTH, TextEnv, TurnResult, text_space

DEFAULT_ID = "game:GuessTheNumber-v0"
DEFAULT_INSTRUCTIONS = "You're a helpful assistant."
"""The system prompt of ROLL's GEM example envs (``*_agent_system_template``)."""

FORMAT_ERROR_REWARD = -0.1
"""GEM's ``LanguageGameReward.format_error_reward``: a game's answer to a response it
could not read (the turn then counts as an invalid action here)."""

_GLOBAL_RNG = threading.Lock()

STEPS_WITHOUT_DRAWS = frozenset({"gem.envs.game_env.guess_the_number.GuessTheNumberEnv"})
"""GEM games whose step draws from neither global generator (read in gem-llm's source;
``tests/envs/gem`` checks that their steps leave both as they were): the lock guards the
generators, so their steps go without it (~0.15 µs of a ~3.5 µs step)."""


OWN_RESULTS = "gem.envs.game_env."
"""GEM's games (classes of modules under this prefix) answer every reset and step with a
new info dict (a literal in each ``return``), a ``str`` observation, a ``float`` reward
and ``bool`` endings, and report none of ``correct``, ``success``, ``action_is_valid``
(read in gem-llm's source; ``tests/envs/gem`` checks the 27 game ids that make here
in milliseconds, offline): the adapter adds
its keys to GEM's own dict, unconverted (~0.2 µs of a ~3.5 µs step). Any other env's
results are converted, and its info copied."""


class AnyText(spaces.Text):
    """Text of any characters: GEM's observations hold whatever its tasks hold
    (``<｜TERMINAL_STATE｜>``, the letters of reasoning-gym's questions)."""

    def contains(self, x: Any) -> bool:
        """Any string up to ``max_length`` characters."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class GemEnv(TextEnv, checked_info=False):  # reset and step set both flags always
    """A GEM env: GEM's observations, rewards and endings, unchanged.

    Args:
        env_id: A GEM id (``game:GuessTheNumber-v0``, ``rg:letter_counting``,
            ``math:GSM8K``, ``qa:HotpotQA``, ``code:CodeContest``, ...).
        instructions: The system prompt.
        observation_template: A format string the observation is shown through
            (ROLL's ``agent_template``: ``{observation}``, ``{current_observation}``,
            ``{suffix}`` (GEM's info), ``{history}`` (empty: the conversation holds it));
            None shows GEM's observation as it is.
        tool_wrapper: GEM's tool wrapper as ROLL configures it (``wrapper_args``,
            ``tool_configs``; :class:`~agentgym.envs.gem.tools.ToolWrapperConfig`).
        use_thread_lock: Run steps under the process-wide lock too (resets always
            are); None: for ``game:`` ids, whose steps may draw random numbers, but
            those of :data:`STEPS_WITHOUT_DRAWS`.
        hub_datasets: Let GEM download a hub ``dataset_name`` (needs the network);
            by default it must name a local file or folder.
        render_mode: ``"ansi"`` or None.
        **kwargs: GEM's constructor arguments for the id (``max_turns``,
            ``dataset_name``, ``question_key``, ...), over the id's registered ones.

    Raises:
        ConfigError: If the id is unknown (with close matches), gem-llm is missing, or a
            hub ``dataset_name`` has no local copy.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        *,
        env_id: str = DEFAULT_ID,
        instructions: str = DEFAULT_INSTRUCTIONS,
        observation_template: str | None = None,
        tool_wrapper: dict[str, Any] | None = None,
        use_thread_lock: bool | None = None,
        hub_datasets: bool = False,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(response_format="answer", format_penalty=0.0, render_mode=render_mode)
        import gem

        spec = check_id(env_id)
        arguments = dict(kwargs)
        name = {**spec.kwargs, **kwargs}.get("dataset_name")
        if name and not hub_datasets and "dataset" not in kwargs:
            key = (
                "env.kwargs.dataset_name"
                if "dataset_name" in kwargs
                else f"{env_id}'s dataset_name"
            )
            split = {**spec.kwargs, **kwargs}.get("split")
            arguments["dataset"] = local_dataset(str(name), split, key)
        self.env_id = env_id
        self.gem_env = gem.make(env_id, **arguments)
        if tool_wrapper is not None:
            self.gem_env = wrap_with_tools(
                self.gem_env, ToolWrapperConfig.from_mapping(tool_wrapper)
            )
        self._instructions = instructions
        self._game = env_id.startswith("game:")
        base = text_space()
        self.observation_space = AnyText(MAX_TEXT_LENGTH, min_length=0, charset=base.character_set)
        self.action_space = AnyText(MAX_TEXT_LENGTH, min_length=0, charset=base.character_set)
        self.observation_template = observation_template
        if use_thread_lock is None:
            kind = type(self.gem_env)
            drawless = f"{kind.__module__}.{kind.__qualname__}" in STEPS_WITHOUT_DRAWS
            use_thread_lock = self._game and not drawless
        self._step_lock = _GLOBAL_RNG if use_thread_lock else None
        self._own_results = type(self.gem_env).__module__.startswith(OWN_RESULTS)
        self._observation_text = ""
        self._success_flag = False

    @property
    def instructions(self) -> str:
        """The system prompt (the task itself is in GEM's first observation)."""
        return self._instructions

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """GEM's ``reset(seed)``; ``options`` are not GEM's and are ignored."""
        if seed is not None:  # Gymnasium's generator, made only if asked for (_np_random)
            self._np_seed: int | None = seed
            self._np_made: np.random.Generator | None = None
            self._np_random_seed = seed  # what np_random_seed reports, as Gymnasium's reset
        self.num_steps = 0
        self._done = False
        _GLOBAL_RNG.acquire()  # not `with`: ~0.1 µs more, in a step of ~3.5 µs
        try:
            observation, info = self.gem_env.reset(seed=seed)
        finally:
            _GLOBAL_RNG.release()
        self._success_flag = False
        if not self._own_results:
            info, observation = dict(info), str(observation)
        info["action_is_valid"] = True  # not update(key=...): ~0.2 µs more
        info["actions"] = []
        info["success"] = False
        self._observation_text = observation
        if self.observation_template is not None:
            observation = self._format(observation, info)
        return observation, info

    @property
    def _np_random(self) -> np.random.Generator | None:
        """Gymnasium's generator, made from the last reset's seed when first asked for:
        GEM draws from generators of its own, and making this one at every reset would
        cost more than a game's step (tens of µs)."""
        seed = getattr(self, "_np_seed", None)
        if getattr(self, "_np_made", None) is None and seed is not None:
            self._np_made, _ = seeding.np_random(seed)
        made: np.random.Generator | None = getattr(self, "_np_made", None)
        return made

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        self._np_made, self._np_seed = value, None

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """GEM's ``step(action)`` on the whole response, its results unchanged."""
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        # Written for speed, each form measured (benchmarks/gem_bench.py): a game's whole
        # step is ~3.5 µs, and every attribute, call or dict operation here is 10-50 ns.
        lock = self._step_lock
        if lock is None:
            observation, reward, terminated, truncated, info = self.gem_env.step(action)
        else:
            lock.acquire()
            try:
                observation, reward, terminated, truncated, info = self.gem_env.step(action)
            finally:
                lock.release()
        self.num_steps += 1
        if self._own_results:  # a GEM game's: its own dict, the right types, no flags
            success = terminated and reward >= 1.0
            info["action_is_valid"] = reward != FORMAT_ERROR_REWARD
        else:
            observation, reward = str(observation), float(reward)
            terminated, truncated, info = bool(terminated), bool(truncated), dict(info)
            if "correct" in info:
                success = bool(info["correct"])
            else:
                success = bool(info.get("success", terminated and reward >= 1.0))
            if "action_is_valid" not in info:
                info["action_is_valid"] = not (self._game and reward == FORMAT_ERROR_REWARD)
        self._done = terminated or truncated
        self._success_flag = success
        info["actions"] = [action]
        info["success"] = success
        self._observation_text = observation
        if self.observation_template is not None:
            observation = self._format(observation, info)
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        """Close GEM's env (a math env's grading process ends with it)."""
        close = getattr(self.gem_env, "close", None)
        if callable(close):
            close()
        super().close()

    def _format(self, observation: str, info: dict[str, Any]) -> str:
        assert self.observation_template is not None
        return self.observation_template.format(
            observation=observation,
            current_observation=observation,
            suffix=info.get("suffix", ""),
            history="",
        )

    # -- TextEnv hooks (reset and step above do not go through them) -------------------

    def _parse(self, text: str) -> ParsedResponse:
        return ParsedResponse(actions=(text,), is_valid=True)

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        raise NotImplementedError("GemEnv.step plays GEM's step directly")

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("GemEnv.reset plays GEM's reset directly")

    def _observation(self) -> str:
        return self._observation_text

    def _success(self) -> bool:
        return self._success_flag
