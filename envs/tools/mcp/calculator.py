"""A small MCP server: a calculator (the official SDK's ``MCPServer``), the default
server of ``env=mcp_tools``. ``python -m agentgym.envs.tools.mcp.calculator`` serves
over stdio; with a port, over streamable HTTP at ``http://127.0.0.1:PORT/mcp``."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return f"{a + b:g}"


@server.tool()
def subtract(a: float, b: float) -> str:
    """Subtract b from a."""
    return f"{a - b:g}"


@server.tool()
def multiply(a: float, b: float) -> str:
    """Multiply two numbers."""
    return f"{a * b:g}"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run(transport="streamable-http", port=int(sys.argv[1]))
    else:
        server.run()
