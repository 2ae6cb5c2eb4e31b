"""Env groups: ``env_groups`` × ``group_size`` envs, one seed per group.

The envs of a group reset with the same seed, so their trajectories form a
GRPO group. Groups are split among tags (env configurations). Seeds come from
the experiment seed and a cursor that only moves forward, so a run resumed
from a checkpoint (which stores :meth:`EnvManager.state_dict`) sees the same
seeds it would have seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.envs.adapter import make_text_env
from agentgym.envs.text_env import TextEnv


@dataclass(frozen=True)
class EnvConfig:
    """What a tag names: a registered env and its constructor arguments.

    Attributes:
        name: A registered env name or Gymnasium id.
        kwargs: Constructor arguments.
    """

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class EnvSlot:
    """One env of the manager and where it sits.

    Attributes:
        env: The env (unwrapped :class:`TextEnv`).
        name: The registered env name it was made from.
        tag: Its tag.
        group_index: Index of its group within the manager.
        index: Its index within the manager.
    """

    env: TextEnv
    name: str
    tag: str
    group_index: int
    index: int


@dataclass(frozen=True)
class Assignment:
    """An episode to run: which env, which seed, which group id."""

    slot: EnvSlot
    seed: int
    group_id: int


def even_split(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` near-equal integers, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


class EnvManager:
    """Builds and seeds the envs of one rollout (train or validation).

    Args:
        tags: Env tags; a tag is a key of ``env_configs`` or a registered env name.
        env_groups: Number of groups per round.
        group_size: Envs per group (GRPO's G); all reset with the group's seed.
        n_groups: Groups per tag (sums to ``env_groups``); default an even split.
        env_configs: Tag → :class:`EnvConfig` (or a ``{name, kwargs}`` mapping, as
            in a YAML config) for tags that are not plain env names.
        seed: The experiment seed.
        fixed_seeds: Reuse the same seeds every round (validation) instead of
            advancing the cursor (training).
        max_traj_per_env: Episodes each env runs per :meth:`assignments` call.
        format_penalty: Overrides every env's ``format_penalty`` when given.
        render_mode: Passed to envs that support it (``"rgb_array"`` to record frames).

    Raises:
        ValueError: On an unknown tag, sizes below 1, or ``n_groups`` that
            does not match ``tags`` and ``env_groups``.
    """

    def __init__(
        self,
        *,
        tags: Sequence[str],
        env_groups: int,
        group_size: int,
        n_groups: Sequence[int] | None = None,
        env_configs: Mapping[str, EnvConfig | Mapping[str, Any]] | None = None,
        seed: int = 0,
        fixed_seeds: bool = False,
        max_traj_per_env: int = 1,
        format_penalty: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        for key, value in [
            ("env_groups", env_groups),
            ("group_size", group_size),
            ("max_traj_per_env", max_traj_per_env),
        ]:
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if not tags:
            raise ValueError("tags must name at least one env")
        if n_groups is None:
            n_groups = even_split(env_groups, len(tags))
        if len(n_groups) != len(tags) or sum(n_groups) != env_groups or min(n_groups) < 0:
            raise ValueError(
                f"n_groups={list(n_groups)} must give a count >= 0 for each of the tags "
                f"{list(tags)} summing to env_groups={env_groups}"
            )
        configs = {
            tag: config if isinstance(config, EnvConfig) else EnvConfig(**config)
            for tag, config in (env_configs or {}).items()
        }
        self.seed = seed
        self.fixed_seeds = fixed_seeds
        self.group_size = group_size
        self.max_traj_per_env = max_traj_per_env
        self.cursor = 0
        self.slots: list[EnvSlot] = []
        self.group_tags: list[str] = []
        for tag, count in zip(tags, n_groups, strict=True):
            config = configs.get(tag, EnvConfig(tag))
            kwargs = dict(config.kwargs)
            if format_penalty is not None:
                kwargs["format_penalty"] = format_penalty
            for _ in range(count):
                group_index = len(self.group_tags)
                self.group_tags.append(tag)
                for _ in range(group_size):
                    env = _make(config.name, kwargs, render_mode)
                    slot = EnvSlot(env, config.name, tag, group_index, len(self.slots))
                    self.slots.append(slot)

    @property
    def num_groups(self) -> int:
        """Groups per round."""
        return len(self.group_tags)

    def assignments(self) -> list[list[Assignment]]:
        """The next batch of episodes: for each env, its episodes in order.

        Each of the ``max_traj_per_env`` rounds gives every group a fresh seed
        (or, with ``fixed_seeds``, the same seeds as every call) and a group id
        unique across the batch and, for training, across the run.
        """
        first = 0 if self.fixed_seeds else self.cursor
        if not self.fixed_seeds:
            self.cursor += self.num_groups * self.max_traj_per_env
        numbers = [
            [first + r * self.num_groups + slot.group_index for r in range(self.max_traj_per_env)]
            for slot in self.slots
        ]
        return [
            [Assignment(slot, self._seed(number), number) for number in slot_numbers]
            for slot, slot_numbers in zip(self.slots, numbers, strict=True)
        ]

    def _seed(self, group_number: int) -> int:
        stream = 1 if self.fixed_seeds else 0
        state = np.random.SeedSequence([self.seed, stream, group_number]).generate_state(1)
        return int(state[0] & 0x7FFFFFFF)

    def state_dict(self) -> dict[str, int]:
        """The seed cursor, for checkpoints."""
        return {"cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore the seed cursor from :meth:`state_dict`."""
        self.cursor = int(state["cursor"])

    def close(self) -> None:
        """Close every env."""
        for slot in self.slots:
            slot.env.close()


def _make(name: str, kwargs: Mapping[str, Any], render_mode: str | None) -> TextEnv:
    # Any Gymnasium text env (plain ones adapted); render_mode goes to the constructor.
    return make_text_env(name, kwargs, render_mode=render_mode)
