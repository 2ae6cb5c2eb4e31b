"""The base class of the tool-use envs: a :class:`TextEnv` whose turns a :class:`ToolBox` plays.

The protocol, the limits and what makes a turn invalid are the ToolBox's
(:mod:`agentgym.envs.tools.toolbox`); a :class:`ToolEnv` adds the task: the
question, the tools that help with it, and the score of an answer.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import TextEnv, TurnResult
from agentgym.envs.tools.protocol import format_call
from agentgym.envs.tools.toolbox import MAX_CALLS_PER_TURN, MAX_RESULT_CHARS, ToolBox
from agentgym.envs.tools.tools import Tool
from agentgym.errors import check_choice


class ToolEnv(TextEnv):
    """A tool-use env: each response calls tools or gives the answer, which ends the episode.

    The env's :class:`ToolBox` parses and plays every turn (``_parse`` and
    ``_play``), and gives the observation, ``success`` and the ``info`` keys
    ``num_tool_calls`` (always) and ``tool_results`` (after reset and every
    step), which the rollout sends back as ``tool`` messages. The system
    prompt is :attr:`_rules`, how to call tools, and :attr:`answer_format`.

    A subclass supplies:

    - ``answer_format`` (class attribute): what goes inside ``<answer>``, with
      an example, for the system prompt.
    - ``_rules``: the task's rules (default: the class docstring's first paragraph).
    - Its tools, passed to ``super().__init__``. A tool's function may be a
      bound method that reads the episode's state: tools run only after
      ``reset``, so the subclass may set its state up after the call.
    - :meth:`_new_task`: the episode's task, drawn from ``self.np_random``.
    - :meth:`_score`: the reward of an answer and whether it solves the task.
    - ``oracle_response()`` (optional): an expert's next response, for
      ``agent=solver`` and warm starts; :meth:`_expert` writes it from the
      calls it makes or the answer it gives.

    It may add state to every ``info`` by extending :meth:`_info`.

    Args:
        tools: The tools the model may call (positional: not a config option).
        max_turns: Responses per episode (the env's ``max_steps``).
        max_tool_calls: Tool calls per episode; a turn that tries to go past
            them truncates the episode.
        max_calls_per_turn: Tool calls one response may make.
        max_result_chars: Longest tool result (longer ones are cut in the middle).
        **kwargs: :class:`TextEnv` options (``response_format``, ``format_penalty``,
            ``render_mode``).

    Raises:
        TypeError: If the subclass sets no ``answer_format``.
        ValueError: If there is no tool or a limit is below 1.
    """

    answer_format: ClassVar[str] = ""
    """What goes inside ``<answer>``, with an example (``"the number only, e.g. ..."``)."""

    def __init__(
        self,
        tools: Sequence[Tool],
        /,
        *,
        max_turns: int,
        max_tool_calls: int,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        max_result_chars: int = MAX_RESULT_CHARS,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_turns, **kwargs)
        if not self.answer_format:
            raise TypeError(f"{type(self).__name__} must define the class attribute answer_format")
        self.toolbox = ToolBox(
            tools,
            max_tool_calls=max_tool_calls,
            max_calls_per_turn=max_calls_per_turn,
            max_result_chars=max_result_chars,
        )

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas."""
        return self.toolbox.schemas

    @property
    def instructions(self) -> str:
        """The rules, how to call tools and how to answer, for a system prompt."""
        return self.toolbox.instructions(self._rules, self.answer_format, think=self._think)

    # -- what a subclass supplies -------------------------------------------------

    @abstractmethod
    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Set up a new episode's task from ``self.np_random``.

        Args:
            options: The reset options.

        Returns:
            The question (the first observation) and the episode info for ``reset``.
        """

    @abstractmethod
    def _score(self, answer: str) -> tuple[float, bool]:
        """Score the content of ``<answer>``: ``(reward, success)``."""

    def _expert(
        self, thought: str, *, calls: Sequence[tuple[str, dict[str, Any]]] = (), answer: str = ""
    ) -> str:
        """An expert's response: ``<think>thought</think>`` when the response format asks
        for it, then ``calls`` (``(tool, arguments)`` pairs) in the tool-call protocol or,
        with none, ``<answer>answer</answer>``."""
        think = f"<think>{thought}</think>" if self._think else ""
        if calls:
            return think + "".join(format_call(name, arguments) for name, arguments in calls)
        return f"{think}<answer>{answer}</answer>"

    # -- TextEnv hooks: the ToolBox parses and plays the turns ---------------------

    @property
    def _think(self) -> bool:
        return self.response_format == "think_answer"

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        question, info = self._new_task(options)
        return {**info, **self.toolbox.reset(question)}

    def _parse(self, text: str) -> ParsedResponse:
        return self.toolbox.parse(text, require_think=self._think)

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        return self.toolbox.play(parsed, self._score)

    def _observation(self) -> str:
        return self.toolbox.observation

    def _success(self) -> bool:
        return self.toolbox.solved

    def _info(self) -> dict[str, Any]:
        return self.toolbox.info()


def task_kinds(key: str, chosen: Sequence[str] | None, kinds: Collection[str]) -> list[str]:
    """The task kinds an env draws from: ``chosen``, or all of ``kinds`` when None.

    Args:
        key: The env option that chose them (``problems``, ``questions``, ...).
        chosen: The kinds asked for, or None for all.
        kinds: Every kind the env has.

    Raises:
        ValueError: If a chosen kind is unknown (with a close match) or none is chosen.
    """
    picked = list(chosen) if chosen is not None else list(kinds)
    for kind in picked:
        check_choice(key, kind, kinds)
    if not picked:
        raise ValueError(f"{key} must name at least one of {list(kinds)}")
    return picked
