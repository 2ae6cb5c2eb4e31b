"""GEM's tool wrapper as ROLL configures it, with agentgym's sandbox and search.

ROLL's ``tool_wrapper`` (``wrapper_args``: ``tool_reward``, ``tool_success_reward``,
``max_tool_uses``; ``tool_configs``: ``{tool_id, tool_args}``) builds GEM's own
``ToolEnvWrapper``, so a tool call's reward, the use count and the "maximum number of
tool use" notice are GEM's. The tools are GEM's too (their instructions, their parsing
of ``<python>``/```` ```python ```` and ``<search>``), with their work done here:

* ``python_code``: the code runs in agentgym's Python sandbox
  (:class:`~agentgym.envs.tools.sandbox.PythonSandbox`: a fresh confined process, the
  installed packages importable) within ``timeout`` seconds, instead of GEM's
  subprocess; what it printed comes back as GEM writes it (``Code execution result:
  ...``). ``sandbox_type: none`` (GEM's unconfined subprocess) allows a sandbox without
  namespaces where the kernel has none; ``keep_error_last_line`` keeps the output's
  last line on a failed run (the sandbox interleaves stdout and stderr).
* ``search``: ``search_url`` is a retrieval server speaking GEM's protocol (a msgpack
  POST of ``{query, topk}``), as in GEM; ``corpus`` (a JSONL file of ``{title, text}``
  or ``{contents}`` rows) is searched here with agentgym's BM25 index instead, no
  server needed. ``corpus`` wins when both are given. :mod:`agentgym.envs.gem.retrieval`
  serves such a corpus over GEM's protocol, for a ``search_url``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

WRAPPER_ARGS = ("tool_reward", "tool_success_reward", "max_tool_uses")
TOOL_ARGS = {
    "python_code": ("timeout", "sandbox_type", "keep_error_last_line"),
    "search": ("search_url", "topk", "timeout", "corpus"),
}
"""The tools built here → the ``tool_args`` each takes."""


@dataclass(frozen=True)
class ToolWrapperConfig:
    """ROLL's ``tool_wrapper`` block.

    Attributes:
        wrapper_args: ``tool_reward``, ``tool_success_reward``, ``max_tool_uses``.
        tools: ``(tool_id, tool_args)`` per tool, in order (GEM tries them in order).
    """

    wrapper_args: dict[str, Any] = field(default_factory=dict)
    tools: tuple[tuple[str, dict[str, Any]], ...] = ()

    @classmethod
    def from_mapping(cls, mapping: dict[str, Any]) -> ToolWrapperConfig:
        """Read and check the block.

        Raises:
            ConfigError: On an unknown key, tool id or tool argument (with close matches).
        """
        _known("tool_wrapper", mapping, ("wrapper_args", "tool_configs"))
        args = dict(mapping.get("wrapper_args") or {})
        _known("tool_wrapper.wrapper_args", args, WRAPPER_ARGS)
        tools = []
        for i, entry in enumerate(mapping.get("tool_configs") or []):
            tool_id = str(entry.get("tool_id"))
            if tool_id not in TOOL_ARGS:
                hint = (
                    " An MCP server's tools: env=mcp_tools (docs/mcp.md)."
                    if tool_id == "mcp"
                    else ""
                )
                raise ConfigError(
                    f"tool_wrapper.tool_configs[{i}].tool_id={tool_id!r} is not built here; "
                    f"known: {sorted(TOOL_ARGS)}.{did_you_mean(tool_id, TOOL_ARGS)}{hint}"
                )
            tool_args = dict(entry.get("tool_args") or {})
            _known(f"tool_wrapper.tool_configs[{i}].tool_args", tool_args, TOOL_ARGS[tool_id])
            tools.append((tool_id, tool_args))
        return cls(args, tuple(tools))


def _known(where: str, mapping: dict[str, Any], known: tuple[str, ...] | list[str]) -> None:
    for key in mapping:
        if key not in known:
            raise ConfigError(
                f"{where}.{key} is not a key here; known: {list(known)}.{did_you_mean(key, known)}"
            )


def wrap_with_tools(env: Any, config: ToolWrapperConfig) -> Any:
    """GEM's ``ToolEnvWrapper`` around ``env`` with the configured tools."""
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    tools = [_TOOLS[tool_id](**args) for tool_id, args in config.tools]
    return ToolEnvWrapper(env, tools, **config.wrapper_args)


def python_code_tool(
    timeout: float = 5, sandbox_type: str = "none", keep_error_last_line: bool = False
) -> Any:
    """GEM's ``PythonCodeTool`` whose code runs in agentgym's sandbox."""
    from gem.tools.python_code_tool import PythonCodeTool

    from agentgym.envs.tools.sandbox import PythonSandbox, SandboxLimits

    sandbox = PythonSandbox(
        limits=SandboxLimits(cpu_seconds=max(1, math.ceil(timeout)), wall_seconds=float(timeout)),
        allow_no_network_isolation=sandbox_type == "none",
        site_packages=True,
    )

    class SandboxedPythonCodeTool(PythonCodeTool):
        def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
            code, parsed_action, is_valid = self._parse_action(action)
            if not is_valid:
                return False, True, "", parsed_action
            result = sandbox.run(code)
            output = result.to_text() if not result.ok else result.output
            if not result.ok and self.keep_error_last_line:
                lines = [line for line in output.splitlines() if line.strip()]
                output = lines[-1] if lines else output
            observation = "Code execution result: " + output.lstrip(" \n") + "\n"
            return True, not result.ok, observation, parsed_action

    return SandboxedPythonCodeTool(
        timeout=timeout, sandbox_type=sandbox_type, keep_error_last_line=keep_error_last_line
    )


def search_tool(
    search_url: str | None = None, topk: int = 3, timeout: float = 5, corpus: str | None = None
) -> Any:
    """GEM's ``SearchTool``: its retrieval server, or agentgym's BM25 over ``corpus``."""
    from gem.tools.search_tool import SearchTool

    if corpus is None:
        return SearchTool(search_url=search_url, topk=topk, timeout=timeout)
    from agentgym.envs.tools.search_qa.kb import Document
    from agentgym.envs.tools.search_qa.search import SearchIndex

    index = SearchIndex(read_corpus(corpus))

    class LocalSearchTool(SearchTool):
        def _search(self, query: str) -> str:
            found: list[Document] = index.search(query, self.topk)
            # GEM's server's result rows, written out as GEM writes them
            rows = [{"document": {"contents": f"{d.title}\n{d.text}"}} for d in found]
            text: str = self._passages2string(rows)
            return text

    return LocalSearchTool(search_url=search_url, topk=topk, timeout=timeout)


def read_corpus(path: str) -> list[Any]:
    """A search corpus: JSONL rows of ``{title, text}`` or GEM's ``{contents}`` (the
    title its first line).

    Raises:
        ConfigError: If the file is missing or a row has neither form.
    """
    from agentgym.envs.tools.search_qa.kb import Document

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"tool_args.corpus={path!r} is not a file; give a JSONL file of "
            '{"title", "text"} or {"contents"} rows'
        )
    documents = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "contents" in row:
            title, _, text = str(row["contents"]).partition("\n")
        elif "title" in row and "text" in row:
            title, text = str(row["title"]), str(row["text"])
        else:
            raise ConfigError(
                f"tool_args.corpus={path!r} line {number} has neither title and text nor "
                f"contents: {sorted(row)}"
            )
        documents.append(Document(title=title, text=text))
    return documents


_TOOLS: dict[str, Callable[..., Any]] = {"python_code": python_code_tool, "search": search_tool}
