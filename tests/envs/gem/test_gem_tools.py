"""GEM's tool wrapper as ROLL configures it: GEM's own ToolEnvWrapper (rewards, use
counts, the last-use notice) with python_code run in agentgym's sandbox and search
answered from a local corpus by agentgym's BM25 index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.errors import ConfigError

gem = pytest.importorskip("gem")

DATA = Path(__file__).parents[2] / "data" / "gem"


def python_wrapper(max_tool_uses: int = 2) -> dict[str, Any]:
    return {
        "wrapper_args": {
            "tool_reward": 0.05,
            "tool_success_reward": 0.1,
            "max_tool_uses": max_tool_uses,
        },
        "tool_configs": [
            {"tool_id": "python_code", "tool_args": {"timeout": 5, "sandbox_type": "none"}}
        ],
    }


def test_python_code_in_the_sandbox_answers_as_gems_own_tool_wrapper() -> None:
    from gem.tools.python_code_tool import PythonCodeTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    actions = [
        "Let me count. <python>print(6 * 7)</python>",
        "```python\nprint(sum(range(10)))\n```",
        "<python>print(1)</python> over the limit: the env answers it",
    ]
    ours = agentgym.make("gem", env_id="rg:letter_counting", tool_wrapper=python_wrapper())
    theirs = ToolEnvWrapper(
        gem.make("rg:letter_counting"),
        [PythonCodeTool(timeout=5, sandbox_type="none")],
        tool_reward=0.05,
        tool_success_reward=0.1,
        max_tool_uses=2,
    )
    for seed in range(3):
        assert ours.reset(seed=seed)[0] == theirs.reset(seed=seed)[0]
        for action in actions:
            mine, gems = ours.step(action), theirs.step(action)
            assert mine[:4] == gems[:4]
    observation, reward, *_ = mine
    assert (observation, reward) == ("<｜TERMINAL_STATE｜>", 0.0)


def test_a_failing_program_earns_only_the_call_reward_and_shows_the_error() -> None:
    env = agentgym.make("gem", env_id="rg:letter_counting", tool_wrapper=python_wrapper(1))
    env.reset(seed=0)
    observation, reward, terminated, _, info = env.step("<python>raise ValueError('boom')</python>")
    assert observation.startswith("Code execution result: Traceback")
    assert "ValueError: boom" in observation
    assert observation.endswith(
        "Reached the maximum number of tool use. Please output final answer directly."
    )
    assert (reward, terminated, info["tool_use_counter"], info["tool_success_counter"]) == (
        0.05,
        False,
        1,
        0,
    )


def test_search_answers_from_the_local_corpus_and_the_qa_env_grades() -> None:
    wrapper = {
        "wrapper_args": {"tool_reward": 0.0, "tool_success_reward": 0.2, "max_tool_uses": 1},
        "tool_configs": [
            {"tool_id": "search", "tool_args": {"corpus": str(DATA / "wiki_corpus.jsonl")}}
        ],
    }
    env = agentgym.make(
        "gem",
        env_id="roll_qa",
        dataset_name=str(DATA / "hotpotqa.jsonl"),
        question_key="problem",
        tool_wrapper=wrapper,
    )
    observation, _ = env.reset(seed=0)
    assert "<search> your query here </search>" in observation  # GEM's tool instructions
    observation, reward, terminated, _, _ = env.step("<search>Eiffel Tower river</search>")
    assert observation.startswith(
        "\n\n<information>Doc 1(Title: Eiffel Tower) The Eiffel Tower stands in Paris, on the "
        "banks of the Seine.\n"
    )
    assert (reward, terminated) == (0.2, False)
    answer = env.unwrapped.gem_env.env.answer[0]  # type: ignore[attr-defined]
    _, reward, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, True, True)


def test_an_answer_without_tags_is_an_invalid_action_scoring_zero() -> None:
    env = agentgym.make(
        "gem", env_id="roll_qa", dataset_name=str(DATA / "hotpotqa.jsonl"), question_key="problem"
    )
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step("Paris, I think")  # GEM's own QaEnv raises here
    assert (reward, terminated, info["action_is_valid"], info["success"]) == (
        0.0,
        True,
        False,
        False,
    )


def test_tools_not_built_here_are_named() -> None:
    wrapper = {"tool_configs": [{"tool_id": "mcp", "tool_args": {"server_url": "xxx"}}]}
    with pytest.raises(
        ConfigError, match=r"tool_id='mcp' is not built here; known: \['python_code'"
    ):
        agentgym.make("gem", env_id="rg:letter_counting", tool_wrapper=wrapper)
    typo = {"tool_configs": [{"tool_id": "search", "tool_args": {"search_ur": "http://x"}}]}
    with pytest.raises(
        ConfigError, match=r"tool_args.search_ur is not a key here.*Did you mean 'search_url'"
    ):
        agentgym.make("gem", env_id="rg:letter_counting", tool_wrapper=typo)


def test_gems_search_client_reads_the_retrieval_server_as_the_local_corpus() -> None:
    import threading

    from agentgym.envs.gem.retrieval import make_server
    from tests.servers import free_port

    corpus = str(DATA / "wiki_corpus.jsonl")
    port = free_port()
    server = make_server(corpus, port=port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answers = []
        for tool_args in ({"search_url": f"http://127.0.0.1:{port}/retrieve"}, {"corpus": corpus}):
            wrapper = {"tool_configs": [{"tool_id": "search", "tool_args": tool_args}]}
            env = agentgym.make(
                "gem",
                env_id="roll_qa",
                dataset_name=str(DATA / "hotpotqa.jsonl"),
                question_key="problem",
                tool_wrapper=wrapper,
            )
            env.reset(seed=0)
            answers.append(env.step("<search>Which author wrote Blade Runner's novel?</search>"))
        assert answers[0][:4] == answers[1][:4]  # GEM's own client, over HTTP
        assert "Doc 1(Title: Blade Runner)" in answers[0][0]
    finally:
        server.shutdown()
        server.server_close()
