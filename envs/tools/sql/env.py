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

from agentgym.envs.text_env import require_reset
from agentgym.envs.tools.sandbox.sql import QueryError, SQLSandbox
from agentgym.envs.tools.sql.database import SCHEMA, generate_shop, write_database
from agentgym.envs.tools.sql.questions import TEMPLATES, SQLQuestion, make_question, same_result
from agentgym.envs.tools.tool_env import ToolEnv, task_kinds
from agentgym.envs.tools.tools import Tool, ToolError

SQL_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "One SQLite SELECT statement."}},
    "required": ["query"],
    "additionalProperties": False,
}
SQL_DESCRIPTION = "Run one read-only SQLite query and return its rows."
_FENCE = re.compile(r"\A```(?:sql)?\s*(.*?)\s*```\Z", re.DOTALL | re.IGNORECASE)
ANSWER_MAX_ROWS = 1000
"""Rows read from an answer query; an answer with more is wrong."""


class SQLEnv(ToolEnv):
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
        query_timeout_seconds: Time limit of one query.
        max_rows: Rows the tool shows.
        **kwargs: :class:`~agentgym.envs.tools.tool_env.ToolEnv`'s own options.

    Raises:
        ValueError: If a question kind is unknown.
    """

    generator_version: ClassVar[int | None] = 1
    answer_format: ClassVar[str] = (
        "one SQLite SELECT query whose result is the answer, e.g. "
        "<answer>SELECT name FROM customers WHERE city = 'Lakeview'</answer>."
    )

    def __init__(
        self,
        *,
        questions: Sequence[str] | None = None,
        max_turns: int = 6,
        max_tool_calls: int = 8,
        query_timeout_seconds: float = 2.0,
        max_rows: int = 30,
        **kwargs: Any,
    ) -> None:
        sql = Tool("sql", SQL_DESCRIPTION, SQL_PARAMETERS, self._run_sql)
        super().__init__([sql], max_turns=max_turns, max_tool_calls=max_tool_calls, **kwargs)
        self.question_kinds = task_kinds("questions", questions, TEMPLATES)
        self.query_timeout_seconds = query_timeout_seconds
        self.max_rows = max_rows
        self._dir = Path(tempfile.mkdtemp(prefix="agentgym-sql-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._episodes = 0
        self.db: SQLSandbox | None = None
        self.task: SQLQuestion | None = None

    @property
    def _rules(self) -> str:
        return (
            "Answer the question about the shop database in the user's message. The sql tool "
            "runs read-only SQLite queries and shows up to "
            f"{self.max_rows} rows; use it to explore and to check your query."
        )

    def _run_sql(self, query: str) -> str:
        """The ``sql`` tool: run one read-only query on the episode's database."""
        try:
            return self._database.query(query).to_text()
        except QueryError as exc:
            raise ToolError(str(exc)) from exc

    @property
    def _database(self) -> SQLSandbox:
        return require_reset(self.db)

    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
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
        return question, {"question_kind": self.task.kind}

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
        task = require_reset(self.task, "oracle_response()")
        calls = [] if self.toolbox.last_results else [("sql", {"query": task.gold_sql})]
        return self._expert("Query the tables.", calls=calls, answer=task.gold_sql)

    def close(self) -> None:
        """Close the current episode's database and delete its file."""
        if self.db is not None:
            self.db.close()
            self.db.path.unlink(missing_ok=True)
            self.db = None
        super().close()
