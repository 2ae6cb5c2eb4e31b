"""Chat tokenization: the fast renderer, exact-id splicing and the prefix check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentgym.rollout.chat import ChatTokenizer, PrefixDriftError, report_drift
from tests.rollout.envs import AddToolEnv

CONVERSATION = [
    {"role": "system", "content": "Play well."},
    {"role": "user", "content": "#__#\nP_X#"},
    {"role": "assistant", "content": "<answer>Up</answer>"},
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "error: bad"},
    {"role": "assistant", "content": "<answer>7</answer>"},
]


@pytest.fixture(params=["chatml", "qwen"])
def tokenizer(request: pytest.FixtureRequest, tiny_model_dir: Path, qwen_model_dir: Path) -> Any:
    path = tiny_model_dir if request.param == "chatml" else qwen_model_dir
    return AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("tools", [None, AddToolEnv().tools])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_fast_render_matches_apply_chat_template(
    tokenizer: Any, tools: Any, generation_prompt: bool
) -> None:
    chat = ChatTokenizer(tokenizer)
    expected = tokenizer.apply_chat_template(
        CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )
    assert chat.render(CONVERSATION, tools=tools, add_generation_prompt=generation_prompt) == (
        expected
    )


def test_qwen_template_groups_tool_results_into_one_user_turn(qwen_model_dir: Path) -> None:
    text = ChatTokenizer(AutoTokenizer.from_pretrained(qwen_model_dir)).render(
        CONVERSATION, tools=AddToolEnv().tools
    )
    assert '"name": "add"' in text
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\nerror: bad\n</tool_response><|im_end|>\n"
    ) in text


def test_segments_concatenate_to_the_full_render(tokenizer: Any) -> None:
    chat = ChatTokenizer(tokenizer)
    eos = tokenizer.eos_token_id
    first = [tokenizer.encode(CONVERSATION[2]["content"]), [eos]]
    second = [tokenizer.encode(CONVERSATION[5]["content"]), [eos]]
    response_1 = first[0] + first[1]
    response_2 = second[0] + second[1]
    ids = chat.first_segment(CONVERSATION[:2]) + response_1
    ids += chat.next_segment(response_1, CONVERSATION[3:5]) + response_2
    full = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert ids == chat.encode(full)[: len(ids)]
    check = chat.check(CONVERSATION, {2: response_1, 5: response_2}, ids)
    assert check.drift is None
    assert check.exact


def test_non_canonical_response_ids_are_kept_and_reported_as_retokenized(tokenizer: Any) -> None:
    chat = ChatTokenizer(tokenizer)
    # "Up" spelled one byte-level piece at a time: same text, different ids
    response = [tokenizer.convert_tokens_to_ids(c) for c in "Up"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(response[:-1]) == "Up"
    messages = [*CONVERSATION[:2], {"role": "assistant", "content": "Up"}]
    ids = chat.first_segment(messages[:2]) + response
    check = chat.check(messages, {2: response}, ids)
    assert check.drift is None
    assert not check.exact


def test_a_template_that_rewrites_history_is_reported(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # Like Qwen3: earlier assistant turns lose their <think> block.
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}"
        "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = ChatTokenizer(tokenizer)
    eos = [tokenizer.eos_token_id]
    r1 = tokenizer.encode("<think>hmm</think><answer>Up</answer>") + eos
    r2 = tokenizer.encode("<answer>Down</answer>") + eos
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": chat.decode_response(r1)},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": chat.decode_response(r2)},
    ]
    ids = chat.first_segment(messages[:1]) + r1 + chat.next_segment(r1, messages[2:3]) + r2
    check = chat.check(messages, {1: r1, 3: r2}, ids)
    assert check.drift is not None
    assert "rewrites assistant messages" in check.drift
    with pytest.raises(PrefixDriftError, match="rewrites"):
        report_drift(check, "strict", "test")
    report_drift(check, "warn", "test")


def test_a_changed_id_is_located(tokenizer: Any) -> None:
    chat = ChatTokenizer(tokenizer)
    response = [*tokenizer.encode("<answer>Up</answer>"), tokenizer.eos_token_id]
    messages = [*CONVERSATION[:2], {"role": "assistant", "content": chat.decode_response(response)}]
    ids = chat.first_segment(messages[:2]) + response
    ids[3] = tokenizer.pad_token_id
    drift = chat.check(messages, {2: response}, ids).drift
    assert drift is not None
    assert "at token 3" in drift


def test_missing_chat_template_is_a_clear_error(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatTokenizer(tokenizer)
