"""Tool-call protocol: parsing, argument checks, and whole turns through ``step``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.envs.text_env import TEXT_CHARSET, text_space
from agentgym.envs.tools.protocol import format_call, parse_call, parse_turn
from agentgym.envs.tools.search_qa import SearchQAEnv
from agentgym.envs.tools.text import sanitize
from agentgym.envs.tools.tools import validate_arguments

SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
    "required": ["query"],
    "additionalProperties": False,
}


def call(name: str, **arguments: object) -> str:
    return format_call(name, dict(arguments))


@pytest.fixture
def env() -> SearchQAEnv:
    env = SearchQAEnv(max_turns=4, max_tool_calls=3, max_calls_per_turn=2, format_penalty=-0.5)
    env.reset(seed=0)
    return env


# -- parsing ----------------------------------------------------------------------


def test_parse_call_reads_name_and_arguments() -> None:
    parsed = parse_call('{"name": "search", "arguments": {"query": "x", "k": 2}}')
    assert (parsed.name, parsed.arguments, parsed.error) == ("search", {"query": "x", "k": 2}, None)


def test_parse_call_accepts_arguments_as_a_json_string_and_literal_newlines() -> None:
    assert parse_call('{"name": "s", "arguments": "{\\"q\\": 1}"}').arguments == {"q": 1}
    assert parse_call('{"name": "python", "arguments": {"code": "a=1\nprint(a)"}}').arguments == {
        "code": "a=1\nprint(a)"
    }


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("{bad json", "malformed JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"arguments": {}}', 'no "name"'),
        ('{"name": "s", "arguments": [1]}', '"arguments" must be a JSON object'),
        ('{"name": "s", "arguments": "not json"}', "not a JSON object"),
        ("[" * 100_000, "malformed JSON"),
    ],
)
def test_parse_call_reports_malformed_calls(body: str, error: str) -> None:
    parsed = parse_call(body)
    assert parsed.error is not None and error in parsed.error


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("I think the answer is 4.", "no <tool_call> and no <answer>"),
        ("<answer>1</answer> <answer>2</answer>", "2 <answer> blocks"),
        ("<answer>  </answer>", "empty <answer>"),
        (call("search", query="x") + "<answer>1</answer>", "not both"),
        ("</answer>", "unbalanced"),
    ],
)
def test_parse_turn_protocol_errors(text: str, error: str) -> None:
    turn = parse_turn(text)
    assert turn.error is not None and error in turn.error


def test_parse_turn_keeps_free_text_and_strips_template_tokens() -> None:
    turn = parse_turn("Let me look.\n" + call("search", query="x") + "<|im_end|>")
    assert turn.error is None and [c.name for c in turn.calls] == ["search"]
    assert parse_turn("So: <answer> 42 </answer><|im_end|>").answer == "42"


def test_unclosed_tool_call_is_a_malformed_call() -> None:
    turn = parse_turn(call("search", query="x") + '<tool_call>{"name": "search"')
    assert turn.error is None
    assert [c.error for c in turn.calls] == [None, "<tool_call> without a closing </tool_call>"]


def test_think_answer_requires_think_first() -> None:
    assert parse_turn("<answer>1</answer>", require_think=True).error is not None
    assert parse_turn("<think>hm</think><answer>1</answer>", require_think=True).answer == "1"


_FRAGMENTS = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "{", "}",
     '"name"', '"arguments"', ":", ",", '"search"', "[", "]", "\\", '"', " ", "x", "\n"]
)  # fmt: skip


@given(st.one_of(st.text(), st.lists(_FRAGMENTS, max_size=40).map("".join)))
@settings(max_examples=300, deadline=None)
def test_parse_turn_never_raises(text: str) -> None:
    turn = parse_turn(text)
    assert (turn.answer is not None) + bool(turn.calls) + (turn.error is not None) >= 1


# -- arguments --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"query": "x"}, None),
        ({"query": "x", "k": 3}, None),
        ({}, "missing required argument(s) ['query']"),
        ({"query": "x", "top": 3}, "unknown argument(s) ['top']"),
        ({"query": 5}, "'query' must be of type string"),
        ({"query": "x", "k": True}, "'k' must be of type integer"),
        ({"query": "x", "k": 2.5}, "'k' must be of type integer"),
        ({"query": "x", "k": 0}, "'k' must be >= 1"),
    ],
)
def test_validate_arguments(arguments: dict[str, object], error: str | None) -> None:
    problem = validate_arguments(SEARCH, arguments)
    assert problem == error if error is None else (problem is not None and error in problem)


def test_sanitize_escapes_characters_outside_the_charset() -> None:
    assert sanitize("café ☕ ok") == "caf\\u00e9 \\u2615 ok"
    assert sanitize("\U0001f600") == "\\U0001f600"
    assert all(char in TEXT_CHARSET for char in sanitize("".join(map(chr, range(4000)))))


# -- whole turns through step -------------------------------------------------------


def test_malformed_json_gets_an_error_result_and_the_format_penalty(env: SearchQAEnv) -> None:
    obs, reward, terminated, truncated, info = env.step("<tool_call>{not json}</tool_call>")
    assert info["tool_results"][0].startswith("Error: malformed JSON")
    assert (info["action_is_valid"], info["invalid_tool_calls"]) == (False, 1)
    assert reward == -0.5
    assert not (terminated or truncated)
    assert "malformed JSON" in obs
    assert env.toolbox.num_tool_calls == 0  # a call that never ran costs no budget


def test_unknown_tool_suggests_the_close_match(env: SearchQAEnv) -> None:
    *_, info = env.step(call("serch", query="x"))
    assert info["tool_results"] == [
        "Error: unknown tool 'serch'. Did you mean 'search'? Available tools: ['search']"
    ]
    assert not info["action_is_valid"]


def test_missing_arguments_are_an_invalid_call(env: SearchQAEnv) -> None:
    *_, info = env.step(call("search"))
    assert "missing required argument(s) ['query']" in info["tool_results"][0]
    assert not info["action_is_valid"]


def test_several_calls_in_one_turn_return_results_in_order(env: SearchQAEnv) -> None:
    kb_titles = [doc.title for doc in env.index.documents] if env.index else []
    first, second = kb_titles[0], kb_titles[1]
    _, reward, _, _, info = env.step(
        call("search", query=first, k=1) + " and " + call("search", query=second, k=1)
    )
    assert [r.splitlines()[0] for r in info["tool_results"]] == [f"[1] {first}", f"[1] {second}"]
    assert (info["actions"], info["action_is_valid"], reward) == (["search", "search"], True, 0.0)
    assert info["num_tool_calls"] == 2


def test_one_bad_call_among_good_ones_makes_the_turn_invalid_but_runs_the_rest(
    env: SearchQAEnv,
) -> None:
    *_, info = env.step(call("search", query="a") + call("search", query=1))
    assert info["tool_results"][0].startswith("[1]") or "No documents" in info["tool_results"][0]
    assert info["tool_results"][1].startswith("Error: bad arguments")
    assert (info["actions"], info["invalid_tool_calls"], info["action_is_valid"]) == (
        ["search"],
        1,
        False,
    )


def test_calls_past_the_per_turn_limit_are_not_run(env: SearchQAEnv) -> None:
    *_, info = env.step(call("search", query="a") * 3)  # max_calls_per_turn=2
    assert "at most 2 tool calls per response" in info["tool_results"][2]
    assert (len(info["tool_results"]), info["num_tool_calls"], info["action_is_valid"]) == (
        3,
        2,
        False,
    )


def test_going_past_the_tool_budget_truncates_the_episode(env: SearchQAEnv) -> None:
    *_, truncated, info = env.step(call("search", query="a") * 2)
    assert not truncated and info["num_tool_calls"] == 2
    *_, truncated, info = env.step(call("search", query="a") * 2)  # the 4th call > 3
    assert truncated and info["num_tool_calls"] == 3
    assert "budget of 3 tool calls is used up" in info["tool_results"][1]


def test_max_turns_truncates(env: SearchQAEnv) -> None:
    for turn in range(4):
        *_, terminated, truncated, _ = env.step("thinking...")
        assert (terminated, truncated) == (False, turn == 3)
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("<answer>x</answer>")


def test_answer_without_a_call_is_scored(env: SearchQAEnv) -> None:
    assert env.task is not None
    _, reward, terminated, _, info = env.step(f"<answer>{env.task.answer}</answer>")
    assert (reward, terminated, info["success"], info["actions"]) == (1.0, True, True, ["answer"])
    assert info["tool_results"] == []


def test_calls_and_answer_together_run_nothing(env: SearchQAEnv) -> None:
    _, reward, terminated, _, info = env.step(call("search", query="a") + "<answer>x</answer>")
    assert not terminated and info["num_tool_calls"] == 0
    assert "not both" in info["tool_results"][0] and reward == -0.5


def test_no_call_and_no_answer_is_a_penalized_turn_without_tool_results(env: SearchQAEnv) -> None:
    obs, reward, *_, info = env.step("hmm")
    assert (reward, info["tool_results"], info["action_is_valid"]) == (-0.5, [], False)
    assert obs.startswith("Invalid response: no <tool_call> and no <answer>")


@given(st.text(max_size=300))
@settings(max_examples=100, deadline=None)
def test_step_never_raises_and_stays_in_the_observation_space(text: str) -> None:
    env = SearchQAEnv()
    env.reset(seed=1)
    obs, _, _, _, info = env.step(text)
    assert text_space().contains(obs)
    assert all(text_space().contains(result) for result in info["tool_results"])
    assert {"action_is_valid", "success", "actions"} <= set(info)


def test_tools_and_instructions() -> None:
    env = SearchQAEnv(response_format="think_answer")
    (schema,) = env.tools
    assert schema["type"] == "function" and schema["function"]["name"] == "search"
    assert schema["function"]["parameters"]["required"] == ["query"]
    json.dumps(env.tools)  # the chat template gets them as JSON
    assert "<tool_call>" in env.instructions and "<answer>" in env.instructions
    assert "<think>" in env.instructions
    assert '"properties"' not in env.instructions  # schemas go through tools=, not the prompt
