"""The data that crosses rooms: turns, trajectories and padded rollout batches.

A :class:`Trajectory` is built by the rollout, turn by turn, token by token
(token-in-token-out): each :class:`Turn` holds the prompt tokens added before
the model's response and the response tokens exactly as the engine returned
them. :class:`RolloutBatch` pads the training samples of many trajectories
into tensors for the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym.choices import STEP_SCORES

TERMINATION_REASONS = (
    "terminated",
    "truncated",
    "max_turns",
    "max_actions",
    "max_length",
    "env_error",
    "generation_error",
    "agent_error",
)
"""Why a trajectory ended: the env finished it (``terminated``), the env's own
step limit (``truncated``), the rollout's limits (``max_turns``,
``max_actions``, ``max_length``: the next turn would not fit in
``sequence_length``), or a failure (``env_error``, ``generation_error``, and
``agent_error``: an agent behind the proxy raised, hung or never called the model)."""

TRUNCATION_REASONS = frozenset({"truncated", "max_turns", "max_actions", "max_length"})
FAILURE_REASONS = frozenset({"env_error", "generation_error", "agent_error"})


@dataclass
class Turn:
    """One model response and what the env made of it.

    Attributes:
        prompt_ids: Tokens placed before the response. In ``trajectory`` mode,
            the tokens added this turn (chat-template segment of the new
            observation plus the generation prompt); in ``step`` mode, the
            whole prompt of this turn's sample.
        response_ids: The generated tokens, exactly as the engine returned
            them (the end-of-turn token included when the model produced it).
        logprobs: The engine's log-probability of each response token.
        response_text: The decoded response, as the env received it.
        finish_reason: ``"stop"`` (end-of-turn or stop token) or ``"length"``.
        reward: The env's reward for this turn.
        action_is_valid: Whether the env could parse the response.
        action_is_effective: Whether the turn changed the env's state (a valid move
            into a wall changes nothing), as the env's ``info["action_is_effective"]``
            says (ROLL's and RAGEN's key); None when the env does not say.
        actions: The actions the env played.
        observation: The observation text the response answered.
        policy_version: The weights version that generated the response (with
            ``async_generation_ratio > 0`` the turns of one episode may differ; for a
            response continued across weight syncs, its first token's).
        token_versions: Each response token's weights version, for a response continued
            across weight syncs (``partial_rollout``); None: all ``policy_version``.
        starts_sample: ``trajectory`` mode: this turn begins a new sample, and
            ``prompt_ids`` is its whole prompt (an agent behind the proxy rewrote its
            history, so the turn's prompt does not extend the previous sample).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    response_text: str
    finish_reason: str
    reward: float = 0.0
    action_is_valid: bool = True
    action_is_effective: bool | None = None
    actions: list[str] = field(default_factory=list)
    observation: str = ""
    policy_version: int = 0
    token_versions: list[int] | None = None
    starts_sample: bool = False


@dataclass
class Trajectory:
    """One episode of one env, with every token of every turn.

    Attributes:
        env_name: The registered env name (e.g. ``"sokoban"``).
        tag: The env tag of the manager config (names an env + kwargs).
        group_id: Unique across the batch; all trajectories of a GRPO group share it.
        seed: The seed the env was reset with.
        env_index: The env's index in its manager (orders trajectories within a group).
        mode: ``"trajectory"`` (one sample per episode) or ``"step"`` (one per turn).
        messages: The conversation (``role``/``content`` dicts), system prompt first.
        tools: The tool schemas given to the chat template (empty for most envs).
        turns: The model's turns, in order.
        score: The episode score: the sum of the turns' rewards.
        success: The env's ``info["success"]`` at the end.
        termination_reason: One of :data:`TERMINATION_REASONS`.
        error: The exception text when the trajectory failed.
        frames: RGB frames (``[H, W, 3]`` uint8) when the rollout recorded them.
        policy_version: The weights version of its first turn (the rollout's
            version when it has none); :attr:`last_policy_version` is its last's.
        prefix_drift: The prefix-consistency check's finding (None: no drift
            or not checked).
        retokenized: True when the model's ids differ from a plain
            tokenization of its text (non-canonical splits; not a drift).
        unreported_info: Turns whose env did not report ``action_is_valid`` or
            ``success`` itself (a plain Gymnasium env through the adapter).
    """

    env_name: str
    tag: str
    group_id: int
    seed: int
    env_index: int = 0
    mode: str = "trajectory"
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    score: float = 0.0
    success: bool = False
    termination_reason: str = ""
    error: str | None = None
    frames: list[Any] = field(default_factory=list)
    policy_version: int = 0
    prefix_drift: str | None = None
    retokenized: bool = False
    unreported_info: int = 0
    final_observation: str = ""
    """The observation the last turn's action led to (what the episode ended on)."""

    @property
    def failed(self) -> bool:
        """True when the env or the generation backend raised."""
        return self.termination_reason in FAILURE_REASONS

    @property
    def last_policy_version(self) -> int:
        """The weights version of the last turn (:attr:`policy_version` without turns)."""
        return self.turns[-1].policy_version if self.turns else self.policy_version

    @property
    def input_ids(self) -> list[int]:
        """All tokens of the episode in order (``trajectory`` mode)."""
        return [t for turn in self.turns for t in (*turn.prompt_ids, *turn.response_ids)]

    @property
    def loss_mask(self) -> list[int]:
        """1 on generated tokens, 0 elsewhere, aligned with :attr:`input_ids`."""
        return [
            m
            for turn in self.turns
            for m in (*([0] * len(turn.prompt_ids)), *([1] * len(turn.response_ids)))
        ]

    @property
    def response_texts(self) -> list[str]:
        """The model's responses, in order."""
        return [turn.response_text for turn in self.turns]

    def samples(self, step_score: str = "turn", step_gamma: float = 1.0) -> list[Sample]:
        """Training samples: the whole episode, or one per turn in ``step`` mode.

        In ``trajectory`` mode a turn that :attr:`Turn.starts_sample` begins a new
        sample (an agent rewrote its history); each sample is judged by the episode's
        score.

        Args:
            step_score: ``step`` mode: each sample's score is its turn's reward
                (``"turn"``), the episode's score (``"episode"``, so that every
                turn of a good episode is credited, as in trajectory-level GRPO), or
                its ``step_return`` (``"return"``, ROLL's ``step_reinforce``).
            step_gamma: Discount over turns of each sample's ``step_return``
                (the return from its turn to the end of the episode).
        """
        if step_score not in STEP_SCORES:
            raise ValueError(f"step_score={step_score!r} is not one of {list(STEP_SCORES)}")
        returns = [0.0] * len(self.turns)
        following = 0.0
        for i in reversed(range(len(self.turns))):
            following = self.turns[i].reward + step_gamma * following
            returns[i] = following
        if self.mode == "step":
            scores = {
                "turn": [turn.reward for turn in self.turns],
                "episode": [self.score] * len(self.turns),
                "return": returns,
            }[step_score]
            return [
                _sample(self, [turn], reward=scores[i], step_return=returns[i])
                for i, turn in enumerate(self.turns)
            ]
        starts = [i for i, turn in enumerate(self.turns) if i == 0 or turn.starts_sample]
        ends = [*starts[1:], len(self.turns)] if starts else []
        return [
            _sample(self, self.turns[start:end], self.score, returns[start])
            for start, end in zip(starts, ends, strict=True)
        ]


@dataclass(frozen=True)
class Sample:
    """One training sequence cut from a trajectory.

    Attributes:
        input_ids: Prompt and response tokens.
        loss_mask: 1 on generated tokens.
        logprobs: Engine log-probabilities, aligned with ``input_ids`` (0 off the mask).
        token_rewards: Each turn's reward on its last generated token.
        score: The reward the sample is judged by (episode score, or the
            turn's reward in ``step`` mode).
        group_id: The trajectory's GRPO group.
        tag: The trajectory's env tag.
        step_return: The discounted return from the sample's (first) turn to
            the end of the episode.
        state: The observation the sample's (first) turn answered: samples of
            one group with the same state are GiGPO's anchor-state group.
        policy_version: The oldest weights version among its turns (its first turn's).
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    token_rewards: list[float]
    score: float
    group_id: int
    tag: str
    step_return: float = 0.0
    state: str = ""
    policy_version: int = 0


def _sample(
    trajectory: Trajectory, turns: Sequence[Turn], reward: float, step_return: float
) -> Sample:
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    rewards: list[float] = []
    for turn in turns:
        ids += turn.prompt_ids
        mask += [0] * len(turn.prompt_ids)
        logprobs += [0.0] * len(turn.prompt_ids)
        rewards += [0.0] * len(turn.prompt_ids)
        ids += turn.response_ids
        mask += [1] * len(turn.response_ids)
        logprobs += turn.logprobs
        rewards += [0.0] * len(turn.response_ids)
        if turn.response_ids:
            rewards[-1] = turn.reward
    return Sample(
        ids,
        mask,
        logprobs,
        rewards,
        reward,
        trajectory.group_id,
        trajectory.tag,
        step_return=step_return,
        state=turns[0].observation,
        policy_version=min(turn.policy_version for turn in turns),
    )


@dataclass
class RolloutBatch:
    """Padded training tensors (right padding).

    Attributes:
        input_ids: ``[B, T]`` token ids (padding id where ``attention_mask`` is 0).
        attention_mask: ``[B, T]`` 1 on real tokens.
        position_ids: ``[B, T]`` positions, 0 at each sequence's first token.
        loss_mask: ``[B, T]`` 1 exactly on generated tokens.
        engine_logprobs: ``[B, T]`` the generation engine's log-probability of
            ``input_ids[b, t]`` given ``input_ids[b, :t]``, 0 off the loss mask.
        token_rewards: ``[B, T]`` each turn's reward on its last generated token.
        scores: ``[B]`` the reward each sample is judged by.
        group_ids: ``[B]`` GRPO group of each sample.
        tags: The env tag of each sample.
        old_logprobs: ``[B, T]`` the trainer's recomputation of the behaviour
            policy's log-probabilities (PPO's π_old), filled by the trainer.
        ref_logprobs: ``[B, T]`` under the frozen reference model, when KL is used.
        is_weights: ``[B, T]`` truncated importance weights (trainer vs engine), when used.
        advantages: ``[B, T]``, filled by the trainer.
        step_returns: ``[B]`` each sample's discounted return from its turn on.
        state_ids: ``[B]`` the anchor-state group of each sample: equal for
            samples of one GRPO group whose turn answered the same observation.
        values: ``[B, T]`` the critic's values the advantages were computed with
            (GAE; 0 off the loss mask), filled by the trainer.
        returns: ``[B, T]`` the critic's targets (GAE), filled by the trainer.
        value_mask: ``[B, T]`` the tokens the critic learns from (GAE): the loss mask
            before the off-policy filter takes tokens out of the policy's loss.
        sample_weights: ``[B]`` per-sample weights of the policy loss
            (``length_loss_weight``), filled per mini-batch by the trainer.
        policy_versions: ``[B]`` the oldest weights version that generated each
            sample (its first turn's), for staleness and off-policy corrections.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    engine_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    scores: torch.Tensor
    group_ids: torch.Tensor
    tags: list[str]
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    step_returns: torch.Tensor | None = None
    state_ids: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    value_mask: torch.Tensor | None = None
    sample_weights: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def rows(self, rows: slice | torch.Tensor, width: int | None = None) -> RolloutBatch:
        """A sub-batch of ``rows`` (a slice or an index tensor), cut to ``width`` columns."""
        columns = slice(0, width)
        fields: dict[str, Any] = {}
        for key, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                value = value[rows]
                fields[key] = value[:, columns] if value.dim() == 2 else value
            elif key == "tags":
                indices = range(len(self))[rows] if isinstance(rows, slice) else rows.tolist()
                fields[key] = [value[i] for i in indices]
            else:
                fields[key] = value
        return RolloutBatch(**fields)

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        *,
        pad_token_id: int,
        include_failed: bool = False,
        step_score: str = "turn",
        step_gamma: float = 1.0,
    ) -> RolloutBatch:
        """Pad the samples of ``trajectories`` into tensors.

        Args:
            trajectories: Finished trajectories.
            pad_token_id: Id written at padded positions.
            include_failed: Keep trajectories whose env or backend raised
                (dropped by default: their episode score is not a real outcome).
            step_score: See :meth:`Trajectory.samples`.
            step_gamma: See :meth:`Trajectory.samples`.

        Raises:
            ValueError: If no sample remains.
        """
        samples = [
            sample
            for trajectory in trajectories
            if include_failed or not trajectory.failed
            for sample in trajectory.samples(step_score, step_gamma)
        ]
        if not samples:
            raise ValueError("no training samples: every trajectory failed or had no turns")
        width = max(len(s.input_ids) for s in samples)

        def pad(rows: list[list[Any]], value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype)

        states: dict[tuple[int, str], int] = {}
        state_ids = [states.setdefault((s.group_id, s.state), len(states)) for s in samples]
        lengths = torch.tensor([len(s.input_ids) for s in samples])
        attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()  # [B, T]
        return cls(
            input_ids=pad([s.input_ids for s in samples], pad_token_id, torch.long),
            attention_mask=attention_mask,
            position_ids=(torch.arange(width)[None, :] * attention_mask),
            loss_mask=pad([s.loss_mask for s in samples], 0, torch.long),
            engine_logprobs=pad([s.logprobs for s in samples], 0.0, torch.float32),
            token_rewards=pad([s.token_rewards for s in samples], 0.0, torch.float32),
            scores=torch.tensor([s.score for s in samples], dtype=torch.float32),
            group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
            tags=[s.tag for s in samples],
            step_returns=torch.tensor([s.step_return for s in samples], dtype=torch.float32),
            state_ids=torch.tensor(state_ids, dtype=torch.long),
            policy_versions=torch.tensor([s.policy_version for s in samples], dtype=torch.long),
        )
