"""Chat-template tokenization for token-in-token-out rollouts.

A trajectory's ids are built once, turn by turn. The model's responses are
never re-tokenized: wherever an assistant message appears, its exact
generated ids are spliced in. To do that, assistant contents are replaced by
sentinel strings before rendering; the rendered text is split at the
sentinels, the scaffolding between them is tokenized, and the generated ids go
in between.

:meth:`ChatTokenizer.check` compares accumulated ids against a fresh render of
the whole conversation by the tokenizer's own ``apply_chat_template``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

logger = logging.getLogger(__name__)

Message = dict[str, str]
PREFIX_CHECK_MODES = ("strict", "warn", "off")

_SENTINEL = "\x00agentgym-assistant-{}\x00"
_SENTINEL_SPLIT = re.compile("\x00agentgym-assistant-(\\d+)\x00")
# A placeholder exchange in front of each new segment, so that templates that
# insist on alternating roles or on a leading system message render it as
# they would mid-conversation.
_BASE = [{"role": "user", "content": "."}]
_MEMO_SIZE = 512
"""Openings and checks remembered by :class:`ChatTokenizer`: the members of a group
open alike (same seed, same first observation) and often answer alike, so each
opening is tokenized, and each conversation checked, once a group."""


class _Memo(dict[Any, Any]):
    """A dict that forgets its oldest entry beyond :data:`_MEMO_SIZE` entries."""

    def remember(self, key: Any, value: Any) -> Any:
        if len(self) >= _MEMO_SIZE:
            # another thread's rollout may evict at the same time: either one's is enough
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del self[next(iter(self))]
        self[key] = value
        return value


def _conversation_key(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
) -> Any:
    """A hashable key of a conversation: its (role, text) pairs when every message is
    just that (the common case, cheap), else a JSON dump of everything."""
    pairs = []
    for message in messages:
        content = message.get("content")
        if len(message) != 2 or "role" not in message or not isinstance(content, str):
            return json.dumps([list(messages), list(tools or ())], sort_keys=True, default=str)
        pairs.append((message["role"], content))
    return tuple(pairs), json.dumps(list(tools), sort_keys=True, default=str) if tools else ""


class PrefixDriftError(RuntimeError):
    """The accumulated ids differ from the chat template's render of the conversation."""


@dataclass(frozen=True)
class PrefixCheck:
    """Result of comparing a trajectory's ids with a full re-render.

    Attributes:
        drift: None when the ids equal the template's render with the model's
            own ids spliced in for its responses; else where and how they differ.
        exact: True when the ids also equal a plain tokenization of the full
            render (False when only the model's non-canonical token splits differ).
    """

    drift: str | None
    exact: bool


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise ValueError(message)


class ChatTokenizer:
    """Tokenize conversations segment by segment with a tokenizer's chat template.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        end_of_turn_ids: Tokens that end an assistant turn (default: the EOS).
        chat_template_kwargs: Extra variables for the template (e.g. ``enable_thinking``).

    Raises:
        ValueError: If the tokenizer has no chat template.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        end_of_turn_ids: Sequence[int] = (),
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ValueError(
                f"{type(tokenizer).__name__} has no chat template (a string); set "
                "tokenizer.chat_template or use a model folder that has one"
            )
        self.tokenizer = tokenizer
        self.end_of_turn_ids = frozenset(end_of_turn_ids or [tokenizer.eos_token_id])
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise
        self._template = environment.from_string(template)
        self._special = {
            key: value
            for key, value in tokenizer.special_tokens_map.items()
            if isinstance(value, str)
        }
        self._backend = tokenizer.backend_tokenizer
        self._prefixes = _Memo()  # text -> ids of the text before a conversation's first reply
        self._openings = _Memo()  # opening messages -> their ids with the generation prompt
        self._checks = _Memo()

    # -- text ---------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """Render ``messages`` to text with the compiled template (fast path)."""
        return self._template.render(
            messages=messages,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            **self._special,
            **self.chat_template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Tokenize scaffolding text (no BOS/EOS added)."""
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def decode_response(self, response_ids: Sequence[int]) -> str:
        """The assistant message content of a response: its text without the end-of-turn token."""
        ids = list(response_ids)
        if ids and ids[-1] in self.end_of_turn_ids:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    # -- ids ----------------------------------------------------------------------

    def render_ids(
        self,
        messages: Sequence[Message],
        responses: Mapping[int, Sequence[int]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        stop_after_last_response: bool = False,
        renderer: Any = None,
    ) -> list[int]:
        """Tokenize a conversation, splicing in exact ids for assistant messages.

        Args:
            messages: The conversation.
            responses: Message index → that assistant message's generated ids.
                Assistant messages not in the map are tokenized as text.
            tools: Tool schemas for the template.
            add_generation_prompt: Append the assistant generation prompt.
            stop_after_last_response: End right after the last spliced response.
            renderer: ``(messages, tools, add_generation_prompt) -> str``;
                defaults to :meth:`render`.

        Returns:
            The token ids.
        """
        marked = [
            {**message, "content": _SENTINEL.format(index)} if index in responses else message
            for index, message in enumerate(messages)
        ]
        render = renderer or (
            lambda msgs, tls, gen: self.render(msgs, tools=tls, add_generation_prompt=gen)
        )
        pieces = _SENTINEL_SPLIT.split(render(marked, tools, add_generation_prompt))
        # the text before the first response is a group's shared opening
        ids = self._encode_prefix(pieces[0]) if len(pieces) > 1 else self.encode(pieces[0])
        for position in range(1, len(pieces), 2):
            response = list(responses[int(pieces[position])])
            ids += response
            if stop_after_last_response and position == len(pieces) - 2:
                break
            ids += self.encode(self._after_response(response, pieces[position + 1]))
        return ids

    def first_segment(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the opening messages (system prompt, first observation) and generation
        prompt (a group's members share one tokenization)."""
        key = _conversation_key(messages, tools)
        found = self._openings.get(key)
        if found is None:
            text = self.render(messages, tools=tools, add_generation_prompt=True)
            found = self._openings.remember(key, tuple(self._encode_prefix(text)))
        return list(found)

    def _encode_prefix(self, text: str) -> list[int]:
        """:meth:`encode`, remembered: for the opening text that a group's members (and
        the prefix check of each) share."""
        found = self._prefixes.get(text)
        if found is None:
            found = self._prefixes.remember(text, tuple(self.encode(text)))
        return list(found)

    def next_segment(
        self,
        previous_response: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Ids after a response: its turn's end, ``new_messages``, the generation prompt.

        Only a short placeholder conversation is rendered, so the cost does not
        grow with the episode.
        """
        base = [*_BASE, {"role": "assistant", "content": _SENTINEL.format(0)}]
        text = self.render([*base, *new_messages], tools=tools, add_generation_prompt=True)
        tail = _SENTINEL_SPLIT.split(text)[-1]
        return self.encode(self._after_response(previous_response, tail))

    def _after_response(self, response: Sequence[int], text: str) -> str:
        """Drop the end-of-turn token's text when the model already generated it."""
        if response and response[-1] in self.end_of_turn_ids:
            eot = str(self.tokenizer.decode([response[-1]], skip_special_tokens=False))
            if text.startswith(eot):
                return text[len(eot) :]
        return text

    # -- checking -----------------------------------------------------------------

    def check(
        self,
        messages: Sequence[Message],
        responses: Mapping[int, Sequence[int]],
        ids: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> PrefixCheck:
        """Compare ``ids`` with the tokenizer's own full render of ``messages``.

        ``ids`` must end with the last response. The render uses
        ``tokenizer.apply_chat_template``, independent of the fast path. A
        conversation checked before (same messages, responses and ids) is not
        rendered again.
        """
        key = (
            _conversation_key(messages, tools),
            tuple(sorted((i, tuple(r)) for i, r in responses.items())),
            tuple(ids),
        )
        found = self._checks.get(key)
        if found is None:
            found = self._checks.remember(key, self._check(messages, responses, ids, tools))
        return found

    def _check(
        self,
        messages: Sequence[Message],
        responses: Mapping[int, Sequence[int]],
        ids: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> PrefixCheck:

        def reference(msgs: Sequence[Message], tls: Any, gen: bool) -> str:
            return str(
                self.tokenizer.apply_chat_template(
                    list(msgs),
                    tools=list(tls) if tls else None,
                    tokenize=False,
                    add_generation_prompt=gen,
                    **self.chat_template_kwargs,
                )
            )

        real_text = reference(messages, tools, False)
        marked_text = reference(
            [
                {**m, "content": _SENTINEL.format(i)} if i in responses else m
                for i, m in enumerate(messages)
            ],
            tools,
            False,
        )
        substituted = _SENTINEL_SPLIT.sub(
            lambda match: messages[int(match.group(1))]["content"], marked_text
        )
        if substituted != real_text:
            return PrefixCheck(
                drift="the chat template rewrites assistant messages of earlier turns "
                + _first_difference(substituted, real_text),
                exact=False,
            )
        expected = self.render_ids(  # the same marks: the marked render is reused
            messages,
            responses,
            tools=tools,
            stop_after_last_response=True,
            renderer=lambda *_: marked_text,
        )
        ids = list(ids)
        if expected != ids:
            return PrefixCheck(
                drift="accumulated ids differ from the re-render "
                + self._first_id_difference(ids, expected),
                exact=False,
            )
        full = self.encode(real_text)
        return PrefixCheck(drift=None, exact=full[: len(ids)] == ids)

    def _first_id_difference(self, ids: list[int], expected: list[int]) -> str:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, expected, strict=False)) if a != b),
            min(len(ids), len(expected)),
        )
        decode = self.tokenizer.decode
        return (
            f"at token {at} (lengths {len(ids)} vs {len(expected)}): "
            f"got {decode(ids[at : at + 8])!r}, expected {decode(expected[at : at + 8])!r}"
        )


def _first_difference(a: str, b: str) -> str:
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return f"at character {at}: {a[at : at + 40]!r} vs {b[at : at + 40]!r}"


def report_drift(check: PrefixCheck, mode: str, where: str) -> None:
    """Act on a check by mode: raise (``strict``), log (``warn``) or nothing (``off``).

    Raises:
        PrefixDriftError: In ``strict`` mode, when there is drift.
    """
    if check.drift is None or mode == "off":
        return
    message = f"{where}: {check.drift}"
    if mode == "strict":
        raise PrefixDriftError(message)
    logger.warning(message)
