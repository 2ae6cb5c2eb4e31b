"""The three tool envs: oracles, scoring by hand, seeding, generators, SQL attacks."""

from __future__ import annotations

import hashlib
import sqlite3
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym
from agentgym.envs.scripted import SolverAgent
from agentgym.envs.text_env import TextEnv
from agentgym.envs.tools.math_tool import GENERATORS, MathToolEnv, Problem, parse_number
from agentgym.envs.tools.protocol import format_call
from agentgym.envs.tools.search_qa import SearchIndex, SearchQAEnv, exact_match, f1_score
from agentgym.envs.tools.search_qa.kb import generate_kb
from agentgym.envs.tools.sql import SQLEnv, same_result
from agentgym.envs.tools.tool_env import ToolEnv

EPISODES = 200


def play(env: TextEnv, seed: int) -> tuple[bool, float, list[str]]:
    """One episode of the scripted expert: success, score, and every tool result seen."""
    agent = SolverAgent()
    env.reset(seed=seed)
    agent.reset(env)
    score, done = 0.0, False
    results: list[str] = []
    info: dict[str, Any] = {}
    while not done:
        _, reward, terminated, truncated, info = env.step(agent.act(env))
        score += reward
        results += info["tool_results"]
        done = terminated or truncated
    return bool(info["success"]), score, results


@pytest.mark.parametrize("name", ["math_tool", "sql", "search_qa"])
def test_the_oracle_solves_at_least_99_percent_of_200_episodes(name: str) -> None:
    env = agentgym.make(name).unwrapped
    assert isinstance(env, TextEnv)
    outcomes = [play(env, seed) for seed in range(EPISODES)]
    solved = sum(success for success, _, _ in outcomes)
    assert solved >= 0.99 * EPISODES, f"{name}: {solved}/{EPISODES}"
    assert all(score == 1.0 for success, score, _ in outcomes if success)


def test_the_math_oracle_answers_with_what_the_sandbox_printed() -> None:
    env = MathToolEnv()
    env.reset(seed=3)
    env.step(env.oracle_response())
    assert env.problem is not None and env.problem.is_correct(env.toolbox.last_results[0])
    assert env.oracle_response() == f"<answer>{env.toolbox.last_results[0].strip()}</answer>"


def test_search_plans_retrieve_the_answer() -> None:
    env = SearchQAEnv()
    for seed in range(50):
        success, _, results = play(env, seed)
        assert env.task is not None and env.task.answer in "\n".join(results) and success


@pytest.mark.parametrize(
    ("env", "wrong"),
    [
        (MathToolEnv(), "<answer>-123456789</answer>"),
        (MathToolEnv(), "<answer>no idea</answer>"),
        (SQLEnv(), "<answer>SELECT name FROM products WHERE price < 0</answer>"),
        (SQLEnv(), "<answer>DROP TABLE customers</answer>"),
        (SearchQAEnv(), "<answer>Nobody Anywhere</answer>"),
        (SearchQAEnv(reward_metric="f1"), "<answer>Nobody Anywhere</answer>"),
    ],
)
def test_a_wrong_answer_scores_zero(env: TextEnv, wrong: str) -> None:
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(wrong)
    assert (reward, terminated, info["success"], info["action_is_valid"]) == (
        0.0,
        True,
        False,
        True,
    )


def test_same_seed_same_episode() -> None:
    for make in (MathToolEnv, SQLEnv, SearchQAEnv):
        first = [make().reset(seed=s)[0] for s in range(10)]
        assert first == [make().reset(seed=s)[0] for s in range(10)]
        assert len(set(first)) >= 8


# -- math -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("$1,234.50", Fraction(246_9, 2)),
        ("the answer is 3/4", Fraction(3, 4)),
        ("-7 apples", Fraction(-7)),
        ("12 then 15", Fraction(15)),
        ("none", None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_answer_checking_by_hand() -> None:
    exact = Problem("arithmetic", "Compute 6 * 7.", Fraction(42), "print(6 * 7)")
    assert exact.is_correct("42") and exact.is_correct("42.0") and not exact.is_correct("43")
    cents = Problem("discount", "...", Fraction("163.40"), "", tolerance=0.01)
    assert cents.is_correct("163.4") and cents.is_correct("$163.41")
    assert not cents.is_correct("163.42")


def test_a_hand_checked_problem() -> None:
    # shopping: packs * per_pack - given must split evenly among the friends
    problem = GENERATORS["shopping"](np.random.default_rng(0))
    numbers = [int(n) for n in problem.question.replace(".", " ").split() if n.isdigit()]
    packs, per_pack, given, friends = numbers
    assert Fraction(packs * per_pack - given, friends) == problem.answer
    assert (packs * per_pack - given) % friends == 0


@given(st.integers(0, 2**32 - 1), st.sampled_from(sorted(GENERATORS)))
@settings(max_examples=300, deadline=None)
def test_generated_code_prints_the_answer(seed: int, kind: str) -> None:
    problem = GENERATORS[kind](np.random.default_rng(seed))
    printed: list[str] = []
    exec(problem.code, {"print": lambda *a: printed.append(" ".join(map(str, a)))})
    assert problem.is_correct(printed[-1]), (problem.question, printed)


# -- SQL ----------------------------------------------------------------------------


def test_same_result_by_hand() -> None:
    assert same_result([("a", 1), ("b", 2)], [(2, "b"), (1.0, "a")])  # any row or column order
    assert same_result([(45.665,)], [(45.67,)])  # ROUND(x, 2) matches x
    assert not same_result([(45.6,)], [(45.62,)])
    assert not same_result([("a",), ("a",)], [("a",)])  # multisets: duplicates count
    assert not same_result([("a",)], [("A",)])


def sql_call(query: str) -> str:
    return format_call("sql", {"query": query})


def fingerprint(env: SQLEnv) -> tuple[str, list[int]]:
    assert env.db is not None
    digest = hashlib.sha256(env.db.path.read_bytes()).hexdigest()
    conn = sqlite3.connect(env.db.path)
    tables = ["customers", "products", "orders", "order_items"]
    counts = [conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables]
    conn.close()
    return digest, counts


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("DROP TABLE customers", "not authorized"),
        ("DELETE FROM orders", "not authorized"),
        ("UPDATE products SET price = 0", "not authorized"),
        ("ATTACH DATABASE '{dir}/evil.db' AS evil", "not authorized"),
        ("PRAGMA writable_schema = 1", "not authorized"),
        ("SELECT 1; DROP TABLE customers", "one statement at a time"),
        (
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT MAX(x) FROM n",
            "time limit of 0.5 s exceeded",
        ),
        ("SELECT load_extension('evil')", "not authorized"),
    ],
)
def test_sql_attacks_are_refused_and_the_database_is_unchanged(
    query: str, error: str, tmp_path: Path
) -> None:
    env = SQLEnv(query_timeout_seconds=0.5)
    env.reset(seed=0)
    before = fingerprint(env)
    _, reward, _, _, info = env.step(sql_call(query.format(dir=tmp_path)))
    assert info["tool_results"][0].startswith("Error:") and error in info["tool_results"][0]
    assert info["action_is_valid"] is False and reward < 0
    assert fingerprint(env) == before
    assert list(tmp_path.iterdir()) == []
    *_, info = env.step(sql_call("SELECT COUNT(*) FROM customers"))  # still works
    assert info["action_is_valid"] is True


def test_sql_rows_are_truncated_at_the_limit() -> None:
    env = SQLEnv(max_rows=3)
    env.reset(seed=0)
    *_, info = env.step(sql_call("SELECT name FROM customers"))
    lines = info["tool_results"][0].splitlines()
    assert lines[0] == "name" and len(lines) == 5 and lines[-1] == "(3 rows, truncated)"


def test_sql_files_are_removed() -> None:
    env = SQLEnv()
    env.reset(seed=0)
    assert env.db is not None
    first = env.db.path
    env.reset(seed=1)
    assert not first.exists()
    env.close()
    assert env.db is None


# -- search -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "gold", "em", "f1"),
    [
        ("The Zaibu Works", "Zaibu Works", 1.0, 1.0),
        ("zaibu works!", "Zaibu Works", 1.0, 1.0),
        ("Zaibu", "Zaibu Works", 0.0, 2 * 1.0 * 0.5 / 1.5),  # precision 1, recall 1/2
        ("Kora", "Zaibu Works", 0.0, 0.0),
    ],
)
def test_qa_metrics_by_hand(prediction: str, gold: str, em: float, f1: float) -> None:
    assert exact_match(prediction, gold) == em
    assert f1_score(prediction, gold) == pytest.approx(f1)


def test_f1_reward_gives_partial_credit() -> None:
    env = SearchQAEnv(reward_metric="f1", question_types=["single"])
    env.reset(seed=0)
    assert env.task is not None
    *_, info = env.step(f"<answer>{env.task.answer} and more words</answer>")
    assert 0 < info["f1"] < 1 and info["em"] == 0.0 and not info["success"]


def test_every_entity_document_is_found_by_its_name() -> None:
    kb = generate_kb(np.random.default_rng(0))
    index = SearchIndex(kb.documents)
    for doc in kb.documents:
        assert index.search(doc.title, k=1)[0].title == doc.title
    assert index.search("zzzz qqqq", k=3) == []


def test_bad_configuration_raises() -> None:
    with pytest.raises(ValueError, match="reward_metric='bleu'"):
        SearchQAEnv(reward_metric="bleu")
    with pytest.raises(ValueError, match="question_types"):
        SearchQAEnv(question_types=["multi"])
    with pytest.raises(ValueError, match="Did you mean 'top_customer'"):
        SQLEnv(questions=["top_customers"])
    with pytest.raises(ValueError, match="max_calls_per_turn must be >= 1"):
        SQLEnv(max_calls_per_turn=0)


@pytest.mark.parametrize("env_class", [MathToolEnv, SQLEnv, SearchQAEnv])
def test_tool_envs_are_tool_envs_one_level_below_text_env(env_class: type) -> None:
    assert env_class.__bases__ == (ToolEnv,)  # the one tool base class, no deeper chain
    assert ToolEnv.__bases__ == (TextEnv,)
    assert "step" not in vars(env_class)  # TextEnv.step plays their turns through _play
