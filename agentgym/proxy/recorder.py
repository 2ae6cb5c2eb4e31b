"""One session's recording: the exact tokens of every request (ROLL's MessageTracker,
done token for token).

The proxy renders each request's messages with the policy's chat template and
tokenizer, generates on the policy's backend, and keeps the engine's ids and
log-probabilities as :class:`~agentgym.trajectory.Turn` s, never re-tokenized text:

* ``trajectory`` mode: a request that repeats the previous request's messages and the
  reply the proxy gave, then adds messages (tool results, observations), extends the
  previous sample: its new tokens are the template's segment after the engine's
  response ids, masked out of the loss, as the env manager's own loop builds them.
  Any other request (the agent summarised, cut or reordered its history) starts a new
  sample (:attr:`Turn.starts_sample`) and counts a prefix break.
* ``step`` mode: each request is its own sample; assistant messages the proxy produced
  are spliced back as the engine's ids.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from agentgym.proxy.messages import (
    Message,
    canonical,
    last_observation,
    parse_tool_calls,
    template_message,
)
from agentgym.rollout.backends.base import GenerationBackend, SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.loop import RolloutConfig, request_seed
from agentgym.trajectory import Turn


class ProxyError(Exception):
    """A request the proxy answers with an OpenAI-shaped error.

    Args:
        status: The HTTP status.
        message: What went wrong and what to do.
        code: OpenAI's error code (e.g. ``context_length_exceeded``).
        kind: OpenAI's error type.
    """

    def __init__(
        self, status: int, message: str, *, code: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


@dataclass(frozen=True)
class RequestParams:
    """A request's sampling options; None takes the run's (``generation``) value.

    Attributes:
        temperature: Sampling temperature.
        top_p: Nucleus mass.
        max_tokens: The most new tokens (at most the run's ``max_new_tokens``).
        seed: Sampling seed; None: one derived from the run's seed and the request's
            place (group, env, turn), as the env manager's own loop derives it.
        stop: Strings that end the response (the text returned stops before them).
        parse_tools: With tools, return Hermes ``<tool_call>`` blocks as ``tool_calls``;
            False (``tool_choice: none``): the tools reach the template, the text comes
            back as the model wrote it.
    """

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    parse_tools: bool = True


@dataclass(frozen=True)
class Reply:
    """What one request generated, as the proxy returns it.

    Attributes:
        content: The assistant message's text (before any tool-call block).
        tool_calls: The parsed tool calls, in OpenAI's shape.
        token_ids: The engine's ids.
        logprobs: Their log-probabilities.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        prompt_tokens: The rendered prompt's length.
    """

    content: str
    tool_calls: list[Message]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    prompt_tokens: int


@dataclass
class _Response:
    message: Message  # canonical, as the proxy returned it
    text: str  # the decoded response, as the template renders it
    ids: list[int]


@dataclass(eq=False)
class SessionRecorder:
    """The recording of one session (one episode of one agent).

    Attributes:
        backend: The policy's generation backend.
        chat: The policy's chat template and tokenizer.
        config: Rollout limits, sampling and mode (its stop ids hold the end-of-turn ids).
        group_id: The episode's group (seeds requests).
        env_index: The episode's env (seeds requests).
        policy_version: Recorded where the backend reports no version.
        backend_env: What the backend's ``env=`` receives (a scripted policy reads it).
        session: The session's name (tool-call ids).
        turns: The model calls, token for token.
        prefix_breaks: Requests that started a new sample (``trajectory`` mode).
        ending: Why the proxy refused to go on (``max_length``, ``max_turns``,
            ``generation_error``), or None.
        error: The generation error's text, if any.
        conversation: The last request's messages and the reply (the trajectory's
            ``messages``).
        tools: The last request's tool schemas.
    """

    backend: GenerationBackend
    chat: ChatTokenizer
    config: RolloutConfig
    _: KW_ONLY
    group_id: int = 0
    env_index: int = 0
    policy_version: int = 0
    backend_env: Any = None
    session: str = "session"
    turns: list[Turn] = field(default_factory=list, init=False)
    prefix_breaks: int = field(default=0, init=False)
    ending: str | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)
    conversation: list[Message] = field(default_factory=list, init=False)
    tools: list[dict[str, Any]] = field(default_factory=list, init=False)
    _history: list[int] = field(default_factory=list, init=False)  # the current sample's ids
    _responses: list[_Response] = field(default_factory=list, init=False)

    async def chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        params: RequestParams,
    ) -> Reply:
        """Render, generate and record one chat request.

        Raises:
            ProxyError: Over ``max_turns`` or the context length (the session records
                why), or when the backend fails.
        """
        if not messages:
            raise ProxyError(400, "messages is empty", code="invalid_messages")
        ordered = [canonical(message) for message in messages]
        tool_list = [dict(tool) for tool in tools or ()]
        prompt, segment, starts = self._prompt(ordered, tool_list)
        turn = await self._generate(prompt, params, segment, last_observation(ordered))
        text, ids = turn.response_text, turn.response_ids
        content, calls = (
            parse_tool_calls(text, f"call_{self.session}_{len(self.turns)}")
            if tool_list and params.parse_tools
            else (text, [])
        )
        reply_message: Message = {"role": "assistant", "content": content}
        if calls:
            reply_message["tool_calls"] = calls
            if turn.finish_reason == "stop":
                turn.finish_reason = "tool_calls"
        turn.starts_sample = starts
        self.turns.append(turn)
        self._history = prompt + ids
        self._responses.append(_Response(reply_message, text, ids))
        self.conversation = [*ordered, reply_message]
        self.tools = tool_list
        return Reply(content, calls, ids, turn.logprobs, turn.finish_reason, len(prompt))

    async def completion(self, prompt: str | Sequence[int], params: RequestParams) -> Reply:
        """Generate and record one plain completion (``/v1/completions``): the prompt's
        ids as given, or the text's tokenization; each request is a sample of its own."""
        ids_in = self.chat.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        self._check_room(ids_in, params)
        turn = await self._generate(ids_in, params, ids_in, "")
        turn.starts_sample = bool(self.turns)
        self.turns.append(turn)
        self._history = []  # a chat request after it starts a new sample
        return Reply(
            turn.response_text,
            [],
            turn.response_ids,
            turn.logprobs,
            turn.finish_reason,
            len(ids_in),
        )

    # -- prompts --------------------------------------------------------------------

    def _prompt(
        self, ordered: list[Message], tools: list[dict[str, Any]]
    ) -> tuple[list[int], list[int], bool]:
        """The request's prompt ids, the part of them its turn records, and whether the
        turn starts a new sample (trajectory mode)."""
        extends = (
            self.config.mode == "trajectory"
            and self._history
            and tools == self.tools
            and len(ordered) > len(self.conversation)
            and ordered[: len(self.conversation)] == self.conversation
        )
        if extends:
            new = [template_message(m) for m in ordered[len(self.conversation) :]]
            segment = self.chat.next_segment(self._responses[-1].ids, new, tools)
            prompt = self._history + segment
        else:
            prompt = segment = self._render(ordered, tools)
        self._check_room(prompt, None)
        starts = self.config.mode == "trajectory" and bool(self.turns) and not extends
        if starts:
            self.prefix_breaks += 1
        return prompt, segment, starts

    def _render(self, ordered: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """The whole conversation's ids: assistant messages the proxy produced (matched
        in order) spliced back as the engine's ids, the rest rendered as text."""
        rendered: list[Message] = []
        spliced: dict[int, list[int]] = {}
        cursor = 0
        for index, message in enumerate(ordered):
            match = None
            if message["role"] == "assistant":
                for position in range(cursor, len(self._responses)):
                    if self._responses[position].message == message:
                        match = position
                        break
            if match is None:
                rendered.append(template_message(message))
                continue
            response = self._responses[match]
            cursor = match + 1
            rendered.append({"role": "assistant", "content": response.text})
            spliced[index] = response.ids
        if not spliced:
            return self.chat.first_segment(rendered, tools)
        return self.chat.render_ids(rendered, spliced, tools=tools, add_generation_prompt=True)

    def _check_room(self, prompt: Sequence[int], params: RequestParams | None) -> None:
        config = self.config
        if len(self.turns) >= config.max_turns:
            self.ending = "max_turns"
            raise ProxyError(
                400,
                f"this episode's {config.max_turns} model turns are used up (max_turns)",
                code="max_turns_exceeded",
            )
        new_tokens = self._max_tokens(params) if params else config.sampling.max_new_tokens
        if len(prompt) + new_tokens > config.sequence_length:
            self.ending = "max_length"
            raise ProxyError(
                400,
                f"the prompt's {len(prompt)} tokens and {new_tokens} new ones pass the "
                f"run's sequence_length={config.sequence_length}",
                code="context_length_exceeded",
            )

    # -- generation -----------------------------------------------------------------

    def _max_tokens(self, params: RequestParams) -> int:
        run = self.config.sampling.max_new_tokens
        return run if params.max_tokens is None else max(1, min(params.max_tokens, run))

    def _sampling(self, params: RequestParams) -> SamplingParams:
        run = self.config.sampling
        seed = params.seed
        if seed is None and run.seed is not None:  # the env manager's own derivation
            seed = request_seed(run.seed, self.group_id, self.env_index, len(self.turns))
        return replace(
            run,
            temperature=run.temperature if params.temperature is None else params.temperature,
            top_p=run.top_p if params.top_p is None else params.top_p,
            max_new_tokens=self._max_tokens(params),
            seed=seed,
        )

    async def _generate(
        self, prompt: list[int], params: RequestParams, recorded: list[int], observation: str
    ) -> Turn:
        """Generate on ``prompt``; the turn that records it (``recorded``: the prompt ids it
        adds, ``observation``: the text it answers), not yet appended."""
        try:
            sampling = self._sampling(params)
        except ValueError as error:
            raise ProxyError(400, str(error), code="invalid_sampling") from error
        try:
            generation = await self.backend.generate(prompt, sampling, env=self.backend_env)
        except Exception as error:
            self.ending = "generation_error"
            self.error = traceback.format_exc(limit=-8)
            raise ProxyError(
                502, f"generation failed: {type(error).__name__}: {error}", code="generation_error"
            ) from error
        ids, logprobs = list(generation.token_ids), list(generation.logprobs)
        finish = generation.finish_reason
        text = self.chat.decode_response(ids)
        if params.stop:
            ids, logprobs, text, finish = self._cut_at_stop(
                ids, logprobs, text, finish, params.stop
            )
        version = generation.policy_version
        return Turn(
            prompt_ids=list(recorded),
            response_ids=ids,
            logprobs=logprobs,
            response_text=text,
            finish_reason=finish,
            observation=observation,
            policy_version=self.policy_version if version is None else version,
        )

    def _cut_at_stop(
        self, ids: list[int], logprobs: list[float], text: str, finish: str, stop: tuple[str, ...]
    ) -> tuple[list[int], list[float], str, str]:
        """Keep the tokens up to the one that completes the first stop string; the text
        returned ends before it (OpenAI's ``stop``). Tokens after it are dropped: the
        agent never saw them, so they are not trained."""
        starts = [text.find(s) for s in stop if s and s in text]
        if not starts:
            return ids, logprobs, text, finish
        at = min(starts)
        for count in range(1, len(ids) + 1):
            partial = self.chat.decode_response(ids[:count])
            if any(s and partial.find(s) == at for s in stop):
                return ids[:count], logprobs[:count], text[:at], "stop"
        return ids, logprobs, text[:at], "stop"

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's text (a response's ``logprobs`` entries)."""
        return [str(self.chat.tokenizer.decode([t], skip_special_tokens=False)) for t in ids]
