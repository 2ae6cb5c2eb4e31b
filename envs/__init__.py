"""agentgym.envs: text environments (Sokoban, FrozenLake, ...) and their base class."""

if __name__ != "agentgym.envs":
    raise ImportError(
        f"The top-level folder 'envs/' is part of agentgym and must be imported as "
        f"'agentgym.envs', not as {__name__!r}. Install the project "
        f"(pip install -e .) and write 'import agentgym.envs'."
    )

from agentgym.registry import discover_plugins, register

register(
    "sokoban",
    "agentgym.envs.sokoban:SokobanEnv",
    id="agentgym/Sokoban-v0",
)
register(
    "sokoban_native",
    "agentgym.envs.sokoban.native:SokobanNativeEnv",
    id="agentgym/SokobanNative-v0",
)
register(
    "frozen_lake",
    "agentgym.envs.frozen_lake:FrozenLakeEnv",
    id="agentgym/FrozenLake-v0",
)
register(
    "webshop",
    "agentgym.envs.webshop:WebShopEnv",
    id="agentgym/WebShop-v1",
)
register(
    "math_tool",
    "agentgym.envs.tools.math_tool:MathToolEnv",
    id="agentgym/MathTool-v0",
)
register(
    "sql",
    "agentgym.envs.tools.sql:SQLEnv",
    id="agentgym/SQL-v0",
)
register(
    "search_qa",
    "agentgym.envs.tools.search_qa:SearchQAEnv",
    id="agentgym/SearchQA-v0",
)
register(
    "mcp_tools",
    "agentgym.envs.tools.mcp:MCPToolEnv",
    id="agentgym/MCPTools-v0",
)
register(
    "math_workflow",
    "agentgym.envs.math_workflow:MathWorkflowEnv",
    id="agentgym/MathWorkflow-v0",
)
register(
    "http",
    "agentgym.envs.http.client:HttpEnv",
    id="agentgym/Http-v0",
)
register(
    "gem",
    "agentgym.envs.gem:GemEnv",
    id="agentgym/Gem-v0",
)
discover_plugins()
