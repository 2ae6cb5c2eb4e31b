"""Read-only SQLite for model-written queries.

Three locks, each enough on its own against writes: the database is opened
read-only (``mode=ro`` URI), an authorizer allows nothing but reading
(``SELECT``, recursive CTEs, functions other than ``load_extension``, and a
few read-only ``PRAGMA`` s: no ``ATTACH``, no writes, no schema changes), and
the connection allows no attached databases. A progress handler aborts a query
past its time limit, and results stop at a row limit.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}
)
"""Pragmas a query may use; every other one (``writable_schema``, ...) is denied."""
_DENIED_FUNCTIONS = frozenset({"load_extension"})
_PROGRESS_INSTRUCTIONS = 1000
"""SQLite virtual-machine instructions between two checks of the time limit."""


class QueryError(Exception):
    """A query was refused, failed or ran out of time; the message says which."""


@dataclass(frozen=True)
class QueryResult:
    """Rows of one query.

    Attributes:
        columns: Column names.
        rows: At most the row limit of rows.
        truncated: Whether the query had more rows than the limit.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool

    def to_text(self, max_cell_chars: int = 100) -> str:
        """The rows as a small ``|``-separated table, for the model."""

        def cell(value: Any) -> str:
            text = "NULL" if value is None else str(value)
            return text if len(text) <= max_cell_chars else text[:max_cell_chars] + "..."

        lines = [" | ".join(self.columns)]
        lines += [" | ".join(cell(value) for value in row) for row in self.rows]
        count = f"{len(self.rows)} row{'s' if len(self.rows) != 1 else ''}"
        lines.append(f"({count}, truncated)" if self.truncated else f"({count})")
        return "\n".join(lines)


def _authorize(action: int, arg1: str | None, arg2: str | None, *_: str | None) -> int:
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_ONLY_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class SQLSandbox:
    """A read-only, time- and row-limited connection to one SQLite file.

    Args:
        path: The database file; it must exist.
        timeout_seconds: Time limit of one query, fetching included.
        max_rows: Rows returned by :meth:`query` unless it is given another limit.
        max_length: Longest string or blob a query may build, in bytes.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If a limit is not positive.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        timeout_seconds: float = 2.0,
        max_rows: int = 50,
        max_length: int = 1_000_000,
    ) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SQLite database {str(path)!r} does not exist")
        for name, value in [
            ("timeout_seconds", timeout_seconds),
            ("max_rows", max_rows),
            ("max_length", max_length),
        ]:
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        self.path = path
        self.timeout_seconds = timeout_seconds
        self.max_rows = max_rows
        self._deadline = 0.0
        # check_same_thread=False: an env is stepped by one thread at a time,
        # but not always the same one.
        uri = f"{path.resolve().as_uri()}?mode=ro"
        self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_length)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
        self._conn.set_authorizer(_authorize)
        self._conn.set_progress_handler(self._past_deadline, _PROGRESS_INSTRUCTIONS)

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self._deadline)

    def query(self, sql: str, *, max_rows: int | None = None) -> QueryResult:
        """Run one read-only statement.

        Args:
            sql: One SQL statement.
            max_rows: Row limit for this query; default ``self.max_rows``.

        Returns:
            The columns and at most ``max_rows`` rows.

        Raises:
            QueryError: If the statement is refused (not read-only), invalid,
                or runs past ``timeout_seconds``.
        """
        limit = self.max_rows if max_rows is None else max_rows
        self._deadline = time.monotonic() + self.timeout_seconds
        cursor = self._conn.cursor()
        try:
            cursor.execute(sql)
            columns = tuple(d[0] for d in cursor.description or ())
            rows = cursor.fetchmany(limit + 1)
        except sqlite3.DatabaseError as exc:
            message = str(exc)
            if message == "interrupted":
                message = f"query interrupted: time limit of {self.timeout_seconds:g} s exceeded"
            elif "not authorized" in message:
                message = "not authorized: only read-only queries (SELECT) are allowed"
            raise QueryError(message) from exc
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            cursor.close()
        return QueryResult(columns, tuple(rows[:limit]), truncated=len(rows) > limit)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
