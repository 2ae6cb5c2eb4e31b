"""``agentgym plan``: the best Megatron layout for a model, devices and an RL step's batch.

Given a model shape, the devices and the batch, it enumerates tensor, pipeline, context
and data parallel sizes, the distributed optimizer, activation recomputation, micro-batch
size and gradient accumulation; estimates each one's per-device memory
(:mod:`~agentgym.plan.memory`) and step time (:mod:`~agentgym.plan.search`); refuses what
does not fit or breaks ROLL's batch rule, and prints the rest ranked with the winner as
ROLL's ``strategy_config`` (:mod:`~agentgym.plan.command`). Formulas: ``docs/plan.md``.
"""

from __future__ import annotations

from agentgym.plan.command import main, roll_yaml
from agentgym.plan.memory import Layout, StateBytes, activation_bytes, state_bytes
from agentgym.plan.search import Devices, Plan, Workload, search
from agentgym.plan.shapes import SHAPES, ModelShape, load_shape

__all__ = [
    "SHAPES",
    "Devices",
    "Layout",
    "ModelShape",
    "Plan",
    "StateBytes",
    "Workload",
    "activation_bytes",
    "load_shape",
    "main",
    "roll_yaml",
    "search",
    "state_bytes",
]
