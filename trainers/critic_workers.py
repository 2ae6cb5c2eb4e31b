"""GAE's critic on Ray: N critic ranks with ``torch.distributed`` across them.

As the policy's :mod:`~agentgym.trainers.workers`: each :class:`CriticRank`
builds the critic strategy (:data:`~agentgym.trainers.strategies.CRITIC_STRATEGIES`)
in its own process after joining its own process group, one rank per device of
``critic.device_mapping``. :class:`CriticGroup` is the driver's
:class:`~agentgym.trainers.strategies.Critic`: values split the batch's rows
over the ranks; a train step deals the micro-batches out, every rank adds up its
share's gradients, and the critic's optimizer step sums them over the ranks
(:func:`~agentgym.trainers.strategies.torch_strategy.optimizer_step`), so DP=N
takes the same step as one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentgym.cluster.handles import WorkerHandle
from agentgym.trainers.strategies.base import Metric, MetricReducer, ValueLossFunction
from agentgym.trainers.workers import GroupRank, TrainerGroup, spawn_ranks
from agentgym.trajectory import RolloutBatch


class CriticRank(GroupRank):
    """One critic rank: builds the critic
    (:data:`~agentgym.trainers.strategies.CRITIC_STRATEGIES`; arguments as
    :class:`~agentgym.trainers.workers.GroupRank`, ``model_path`` the value model's
    starting folder)."""

    def build(self) -> Any:
        """See :func:`~agentgym.trainers.strategies.build_critic`."""
        from agentgym.trainers.strategies import build_critic

        return build_critic(
            self.strategy_name, Path(self.model_path), self.strategy_config, **self.settings
        )

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """See :meth:`Critic.values`."""
        return self.strategy.values(batch)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> dict[str, Metric]:
        """This rank's share of micro-batches, then the group's optimizer step."""
        return self.strategy.train_step(micro_batches, loss_fn)


class CriticGroup:
    """The driver's :class:`~agentgym.trainers.strategies.Critic` over N critic ranks.

    Args:
        handles: The ranks, rank 0 first.
        rpc_timeout: Seconds a call to the ranks may take (None: the handles' default).
    """

    def __init__(self, handles: Sequence[WorkerHandle], *, rpc_timeout: float | None = None):
        self._ranks = TrainerGroup(handles, rpc_timeout=rpc_timeout)  # the same calls

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return self._ranks.world_size

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]``: the batch's rows split over the ranks."""
        return self._ranks.call_on_rows("values", batch)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> dict[str, Metric]:
        """Deal the micro-batches out (rank ``r`` takes a contiguous share), step together.

        Summed metrics add up over the ranks; averaged ones (``grad_norm``, ``lr``,
        the same on every rank) are averaged.
        """
        from agentgym.trainers.workers import deal

        shares = deal(list(micro_batches), self.world_size)
        results = self._ranks.call_each("train_step", [(share, loss_fn) for share in shares])
        reducer = MetricReducer()
        for metrics in results:
            reducer.add(metrics)
        return reducer.metrics()

    def save(self, directory: Path) -> None:
        """Rank 0 writes the critic."""
        self._ranks.save(directory)

    def load(self, directory: Path) -> None:
        """Every rank loads the critic."""
        self._ranks.load(directory)

    def train(self, mode: bool = True) -> None:
        """Every rank's value model to training or evaluation mode."""
        self._ranks.train(mode)

    def close(self) -> None:
        """Every rank leaves the process group."""
        self._ranks.close()


def start_critic_group(
    cluster: Any,
    placements: Sequence[Any],
    *,
    strategy_name: str,
    model_path: Path,
    strategy_config: Mapping[str, Any],
    settings: Mapping[str, Any],
    rpc_timeout: float | None = None,
) -> CriticGroup:
    """Spawn one :class:`CriticRank` per placement (``critic``'s workers), join them
    in a process group and build the critic on each (arguments as
    :func:`~agentgym.trainers.workers.start_trainer_group`)."""
    ranks = spawn_ranks(
        cluster,
        CriticRank,
        "critic",
        placements,
        (strategy_name, str(model_path), dict(strategy_config), dict(settings)),
        rpc_timeout=rpc_timeout,
    )
    return CriticGroup(ranks.handles, rpc_timeout=rpc_timeout)
