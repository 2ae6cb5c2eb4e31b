"""A tool env whose tools come from an MCP server (``env=mcp_tools``)."""

from agentgym.envs.tools.mcp.env import MCPToolEnv

__all__ = ["MCPToolEnv"]
