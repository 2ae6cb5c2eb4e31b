"""SQL: answer a question about a generated shop database with one SQL query."""

from __future__ import annotations

import re
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import TextEnv, TurnResult
from agentgym.envs.tools.protocol import format_call
from agentgym.envs.tools.sandbox.sql import QueryError, SQLSandbox
from agentgym.envs.tools.sql.database import SCHEMA, generate_shop, write_database
from agentgym.envs.tools.sql.questions import TEMPLATES, SQLQuestion, make_question, same_result
from agentgym.envs.tools.toolbox import MAX_CALLS_PER_TURN, MAX_RESULT_CHARS, ToolBox
from agentgym.envs.tools.tools import Tool, ToolError
from agentgym.errors import did_you_mean

SQL_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "One SQLite SELECT statement."}},
    "required": ["query"],
    "additionalProperties": False,
}
_FENCE = re.compile(r"\A```(?:sql)?\s*(.*?)\s*```\Z", re.DOTALL | re.IGNORECASE)
ANSWER_MAX_ROWS = 1000
"""Rows read from an answer query; an answer with more is wrong."""


ANSWER_FORMAT = (
    "one SQLite SELECT query whose result is the answer, e.g. "
    "<answer>SELECT name FROM customers WHERE city = 'Lakeview'</answer>."
)


class SQLEnv(TextEnv):
    """SQL: answer a question about a shop database by writing one SQL query.

    Every seed generates a new SQLite database (customers, products, orders,
    order items; see :mod:`agentgym.envs.tools.sql.database`) and a question
    with a gold query. The ``sql`` tool runs read-only queries. The answer is a
    query: reward 1 when its result set equals the gold one (rows in any
    order, columns in any order, numbers within a cent), 0 otherwise.

    Args:
        questions: Question kinds to draw from (keys of
            :data:`~agentgym.envs.tools.sql.questions.TEMPLATES`); default all.
        max_turns: Responses per episode.
        max_tool_calls: Tool calls per episode.
        max_calls_per_turn: Tool calls one response may make.
        max_result_chars: Longest tool result (longer ones are cut in the middle).
        query_timeout_seconds: Time limit of one query.
        max_rows: Rows the tool shows.
        **kwargs: :class:`TextEnv` options (``response_format``, ``format_penalty``,
            ``render_mode``).

    Raises:
        ValueError: If a question kind is unknown.
    """

    generator_version: ClassVar[int | None] = 1
    """Raised whenever the same seed would give a different task."""

    def __init__(
        self,
        *,
        questions: Sequence[str] | None = None,
        max_turns: int = 6,
        max_tool_calls: int = 8,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        max_result_chars: int = MAX_RESULT_CHARS,
        query_timeout_seconds: float = 2.0,
        max_rows: int = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_turns, **kwargs)
        kinds = list(questions) if questions is not None else list(TEMPLATES)
        for kind in kinds:
            if kind not in TEMPLATES:
                hint = did_you_mean(kind, TEMPLATES)
                raise ValueError(f"Unknown question kind {kind!r}.{hint} Valid: {list(TEMPLATES)}")
        if not kinds:
            raise ValueError(f"questions must name at least one of {list(TEMPLATES)}")
        self.question_kinds = kinds
        self.query_timeout_seconds = query_timeout_seconds
        self.max_rows = max_rows
        self._dir = Path(tempfile.mkdtemp(prefix="agentgym-sql-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._episodes = 0
        self.db: SQLSandbox | None = None
        self.task: SQLQuestion | None = None
        self.toolbox = ToolBox(
            [
                Tool(
                    "sql",
                    "Run one read-only SQLite query and return its rows.",
                    SQL_PARAMETERS,
                    self._run_sql,
                )
            ],
            max_tool_calls=max_tool_calls,
            max_calls_per_turn=max_calls_per_turn,
            max_result_chars=max_result_chars,
        )

    @property
    def _rules(self) -> str:
        return (
            "Answer the question about the shop database in the user's message. The sql tool "
            "runs read-only SQLite queries and shows up to "
            f"{self.max_rows} rows; use it to explore and to check your query."
        )

    def _run_sql(self, query: str) -> str:
        try:
            return self._database.query(query).to_text()
        except QueryError as exc:
            raise ToolError(str(exc)) from exc

    @property
    def _database(self) -> SQLSandbox:
        if self.db is None:
            raise RuntimeError("call reset() before using the env")
        return self.db

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.close()
        self._episodes += 1
        path = self._dir / f"shop-{self._episodes}.db"
        shop = generate_shop(self.np_random)
        write_database(shop, path)
        conn = sqlite3.connect(path)
        try:
            self.task = make_question(self.np_random, shop, self.question_kinds, conn)
        finally:
            conn.close()
        self.db = SQLSandbox(
            path, timeout_seconds=self.query_timeout_seconds, max_rows=self.max_rows
        )
        question = f"Database schema:\n{SCHEMA}\n\nQuestion: {self.task.question}"
        return {"question_kind": self.task.kind, **self.toolbox.reset(question)}

    # -- tool turns: the ToolBox parses and plays them --------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas."""
        return self.toolbox.schemas

    @property
    def instructions(self) -> str:
        """The rules, how to call tools and how to answer, for a system prompt."""
        return self.toolbox.instructions(self._rules, ANSWER_FORMAT, think=self._think)

    @property
    def _think(self) -> bool:
        return self.response_format == "think_answer"

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

    def _score(self, answer: str) -> tuple[float, bool]:
        fenced = _FENCE.match(answer)
        query = fenced.group(1) if fenced else answer
        if self.task is None:
            return 0.0, False
        try:
            gold = self._database.query(self.task.gold_sql, max_rows=ANSWER_MAX_ROWS)
            given = self._database.query(query, max_rows=ANSWER_MAX_ROWS)
        except QueryError:
            return 0.0, False
        correct = not given.truncated and same_result(gold.rows, given.rows)
        return float(correct), correct

    def oracle_response(self) -> str:
        """What an expert writes now: run the gold query once, then answer with it."""
        if self.task is None:
            raise RuntimeError("call reset() before oracle_response()")
        think = "<think>Query the tables.</think>" if self.response_format == "think_answer" else ""
        if not self.toolbox.last_results:
            return think + format_call("sql", {"query": self.task.gold_sql})
        return f"{think}<answer>{self.task.gold_sql}</answer>"

    def close(self) -> None:
        """Close the current episode's database and delete its file."""
        if self.db is not None:
            self.db.close()
            self.db.path.unlink(missing_ok=True)
            self.db = None
        super().close()
