"""Math word problems with a sandboxed ``python`` tool."""

from agentgym.envs.tools.math_tool.env import MathToolEnv
from agentgym.envs.tools.math_tool.problems import GENERATORS, Problem, parse_number

__all__ = ["GENERATORS", "MathToolEnv", "Problem", "parse_number"]
