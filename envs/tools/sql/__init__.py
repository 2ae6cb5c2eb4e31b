"""Text-to-SQL over a generated shop database, with a read-only ``sql`` tool."""

from agentgym.envs.tools.sql.database import SCHEMA, ShopData, generate_shop, write_database
from agentgym.envs.tools.sql.env import SQLEnv
from agentgym.envs.tools.sql.questions import TEMPLATES, SQLQuestion, same_result

__all__ = [
    "SCHEMA",
    "TEMPLATES",
    "SQLEnv",
    "SQLQuestion",
    "ShopData",
    "generate_shop",
    "same_result",
    "write_database",
]
