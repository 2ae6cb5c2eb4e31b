"""The MCP server of the tests: the calculator ``env=mcp_tools`` ships
(:mod:`agentgym.envs.tools.mcp.calculator`) plus a tool that stalls (for timeouts) and
one that kills the server (for a server that dies mid-episode). ``python
mcp_calculator.py`` serves over stdio; ``python mcp_calculator.py PORT`` over streamable
HTTP at ``http://127.0.0.1:PORT/mcp``."""

from __future__ import annotations

import asyncio
import os
import sys

from agentgym.envs.tools.mcp.calculator import server


@server.tool()
async def slow(seconds: float) -> str:
    """Wait, then say so (for timeouts)."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def crash() -> str:
    """End the server's process at once."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run(transport="streamable-http", port=int(sys.argv[1]))
    else:
        server.run()
