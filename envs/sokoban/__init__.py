"""Sokoban: procedural rooms, gym-sokoban dynamics, an exact solver."""

from agentgym.envs.sokoban.env import SokobanEnv
from agentgym.envs.sokoban.generator import GeneratedRoom, GenerationError, generate_room
from agentgym.envs.sokoban.room import ACTIONS, SYMBOLS, Room
from agentgym.envs.sokoban.solver import solve

__all__ = [
    "ACTIONS",
    "SYMBOLS",
    "GeneratedRoom",
    "GenerationError",
    "Room",
    "SokobanEnv",
    "generate_room",
    "solve",
]
