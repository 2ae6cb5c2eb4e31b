"""Supervised warm start: teach a fresh chat model the action format from the
envs' own experts.

The envs' solvers (``env.solve()``: Sokoban's A*, FrozenLake's BFS) label
states with a shortest plan's first action. Each (state, action) pair becomes
one example rendered exactly as the rollout's ``step`` mode prompts without
history: the env's instructions as the system message, the observation as the
user message, the chat template's generation prompt, then the expert's answer
(``<answer>Up</answer>`` and the end-of-turn token), which alone carries the
loss. The warm start is meant to be short: the model learns the format and a
rough policy, and reinforcement learning has room to improve it. With
``label_noise`` the demonstrator is ε-greedy (a fraction of labels are random
actions), as in offline-RL "medium" datasets: the model learns to read the
board but samples a diluted policy, which reinforcement learning sharpens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label of tokens that carry no loss (prompts, padding)."""


def _default_envs() -> dict[str, dict[str, Any]]:
    return {"sokoban": {}, "frozen_lake": {}}


@dataclass(frozen=True)
class WarmStartSpec:
    """How the warm start is done (part of the tiny model's cache key).

    Attributes:
        steps: AdamW steps; 0 leaves the weights random.
        batch_size: Examples per step.
        learning_rate: Constant AdamW learning rate.
        weight_decay: AdamW weight decay.
        examples_per_env: (state, action) pairs collected from each env.
        explore: Probability of a random move while an episode is played, so
            that the pairs also cover states off the expert's path (each visited
            state is labelled by the solver from where it is).
        label_noise: Probability that an example's label is a uniformly random
            action instead of the solver's (an ε-greedy demonstrator); the
            move played is unaffected.
        envs: Env name → constructor arguments of the envs that demonstrate.
            Every env needs a ``solve()`` method.
        seed: Seeds the episodes, the exploration, the batches and the update.
    """

    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    examples_per_env: int = 4096
    explore: float = 0.25
    label_noise: float = 0.0
    envs: Mapping[str, Mapping[str, Any]] = field(default_factory=_default_envs)
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "examples_per_env"):
            if getattr(self, key) < (0 if key == "steps" else 1):
                raise ValueError(f"warm start {key} must be positive, got {getattr(self, key)}")
        if not 0.0 <= self.explore < 1.0:
            raise ValueError(f"warm start explore must be in [0, 1), got {self.explore}")
        if not 0.0 <= self.label_noise <= 1.0:
            raise ValueError(f"warm start label_noise must be in [0, 1], got {self.label_noise}")
        if not self.envs:
            raise ValueError("warm start envs must name at least one env with a solver")


@dataclass(frozen=True)
class Example:
    """One demonstration, tokenized.

    Attributes:
        env_name: The env that produced it.
        prompt_ids: The chat-template prompt (system, observation, generation prompt).
        answer_ids: The expert's answer tokens, the end-of-turn token included.
        action: The expert's action name.
    """

    env_name: str
    prompt_ids: list[int]
    answer_ids: list[int]
    action: str


def expert_pairs(
    name: str,
    kwargs: Mapping[str, Any],
    count: int,
    *,
    explore: float,
    seed: int,
    label_noise: float = 0.0,
) -> list[tuple[str, str, str, str]]:
    """``count`` (instructions, observation, expert action, response format) tuples.

    Episodes are played from seeds ``seed, seed + 1, ...``: the solver's action
    is recorded at every state (a random action instead, with probability
    ``label_noise``); with probability ``explore`` a random action is played
    instead of the solver's. States the solver cannot solve (a Sokoban box in
    a corner, a FrozenLake hole) end the episode without a label.

    Raises:
        TypeError: If the env is not a :class:`TextEnv` with a ``solve()``.
    """
    import agentgym
    from agentgym.envs.text_env import TextEnv

    env = agentgym.make(name, **dict(kwargs)).unwrapped
    if not isinstance(env, TextEnv):
        raise TypeError(f"warm start: env {name!r} is not an agentgym TextEnv")
    solve = getattr(env, "solve", None)
    if not callable(solve):
        raise TypeError(f"warm start: env {name!r} has no solve() to demonstrate with")
    rng = np.random.default_rng(seed)
    label_rng = np.random.default_rng([seed, 1])  # its own stream: the moves don't depend on it
    pairs: list[tuple[str, str, str, str]] = []
    episode = seed
    while len(pairs) < count:
        observation, _ = env.reset(seed=episode)
        episode += 1
        done = False
        while not done and len(pairs) < count:
            plan = solve()
            if not plan:  # solved already, or unsolvable from here
                break
            label = plan[0]
            if label_rng.random() < label_noise:
                label = env.action_names[int(label_rng.integers(len(env.action_names)))]
            pairs.append((env.instructions, observation, label, env.response_format))
            action = plan[0]
            if rng.random() < explore:
                action = env.action_names[int(rng.integers(len(env.action_names)))]
            observation, _, terminated, truncated, _ = env.step(f"<answer>{action}</answer>")
            done = terminated or truncated
    env.close()
    return pairs


def build_examples(tokenizer: Any, spec: WarmStartSpec) -> list[Example]:
    """Every env's demonstrations, tokenized as the rollout's ``step`` prompts."""
    from agentgym.envs.scripted import format_response

    examples = []
    for offset, (name, kwargs) in enumerate(sorted(spec.envs.items())):
        pairs = expert_pairs(
            name,
            kwargs,
            spec.examples_per_env,
            explore=spec.explore,
            seed=spec.seed * 1_000_003 + offset * 100_003,
            label_noise=spec.label_noise,
        )
        for instructions, observation, action, response_format in pairs:
            answer = format_response([action], response_format)
            examples.append(
                Example(
                    env_name=name,
                    prompt_ids=prompt_ids(tokenizer, instructions, observation),
                    answer_ids=[
                        *tokenizer.encode(answer, add_special_tokens=False),
                        tokenizer.eos_token_id,
                    ],
                    action=action,
                )
            )
    return examples


def prompt_ids(tokenizer: Any, instructions: str, observation: str) -> list[int]:
    """The ``step``-mode prompt without history: system, observation, generation prompt."""
    messages = [
        {"role": "system", "content": instructions},
        {"role": "user", "content": observation},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def collate(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (answers only), ``[B, T]``."""
    rows = [e.prompt_ids + e.answer_ids for e in examples]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id)  # [B, T]
    labels = torch.full((len(rows), width), IGNORE_INDEX)  # [B, T]
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    for i, (example, row) in enumerate(zip(examples, rows, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(example.prompt_ids) : len(row)] = torch.tensor(example.answer_ids)
        attention_mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def answer_loss(model: Any, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens (the scalar the warm start minimizes)."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits[:, :-1]  # [B, T-1, V]: position t predicts token t + 1
    return torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE_INDEX
    )


def warm_start(model: Any, examples: Sequence[Example], spec: WarmStartSpec) -> list[float]:
    """Train ``model`` in place on random batches of ``examples``.

    Returns:
        The loss of every step, in order.
    """
    generator = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay
    )
    pad = int(model.config.pad_token_id)
    losses = []
    model.train()
    for _ in range(spec.steps):
        rows = torch.randint(len(examples), (spec.batch_size,), generator=generator)
        loss = answer_loss(model, collate([examples[int(i)] for i in rows], pad))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def greedy_answers(
    model: Any, tokenizer: Any, examples: Sequence[Example], max_new_tokens: int = 8
) -> list[str]:
    """The model's greedy answer text to each example's prompt (end-of-turn token cut)."""
    pad = int(tokenizer.pad_token_id)
    width = max(len(e.prompt_ids) for e in examples)
    input_ids = torch.tensor(
        [[pad] * (width - len(e.prompt_ids)) + e.prompt_ids for e in examples]
    )  # [B, P], left-padded
    attention_mask = (
        torch.arange(width)[None, :]
        >= width - torch.tensor([len(e.prompt_ids) for e in examples])[:, None]
    ).long()  # [B, P]
    output = model.eval().generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
    )[:, width:]  # [B, N]
    return [
        str(tokenizer.decode([t for t in row if t not in (pad, tokenizer.eos_token_id)]))
        for row in output.tolist()
    ]
