"""Trinity-RFT's ``math_workflow`` as an env: GSM8K-style questions, Trinity's math reward."""

from agentgym.envs.math_workflow.env import MathWorkflowEnv, build_tasks
from agentgym.envs.math_workflow.problems import generate_problems, write_problems
from agentgym.envs.math_workflow.reward import SYSTEM_PROMPT, MathScore, math_reward

__all__ = [
    "SYSTEM_PROMPT",
    "MathScore",
    "MathWorkflowEnv",
    "build_tasks",
    "generate_problems",
    "math_reward",
    "write_problems",
]
