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
By default (``label_noise_mode="expected"``) the noise is not sampled: the
loss at the action token is the demonstrator's expected cross-entropy,
``(1 - ε)·CE(expert) + ε·mean_a CE(a)``. Its optimum is the same diluted
policy, but without the noise in the gradient the model learns to read the
board much sooner: on held-out Sokoban states, the tiny model's greedy action
was right 34% of the time after 600 steps at ε = 0.6 with sampled labels
(25% is chance), and 97% with the expected loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label of tokens that carry no loss (prompts, padding)."""

LABEL_NOISE_MODES = ("expected", "sampled")
"""How ``label_noise`` enters the loss; see :class:`WarmStartSpec`."""


def _default_envs() -> dict[str, dict[str, Any]]:
    # the rooms of configs/env/sokoban.yaml and frozen_lake.yaml: the default run's envs
    return {
        "sokoban": {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10, "search_depth": 3},
        "frozen_lake": {"size": 4, "is_slippery": False, "max_steps": 10},
    }


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
        label_noise_mode: ``expected``: labels stay the solver's and the loss
            at the action token is the ε-greedy demonstrator's expected
            cross-entropy (needs every action's answer to differ from the
            others in one token); ``sampled``: each label is drawn.
        envs: Env name → constructor arguments of the envs that demonstrate.
            Every env needs a ``solve()`` method.
        seed: Seeds the episodes, the exploration, the batches and the update.
    """

    steps: int = 600
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    examples_per_env: int = 4096
    explore: float = 0.25
    label_noise: float = 0.7
    label_noise_mode: str = "expected"
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
        if self.label_noise_mode not in LABEL_NOISE_MODES:
            raise ValueError(
                f"warm start label_noise_mode must be one of {LABEL_NOISE_MODES}, "
                f"got {self.label_noise_mode!r}"
            )
        if not self.envs:
            raise ValueError("warm start envs must name at least one env with a solver")

    @property
    def expected_noise(self) -> float:
        """ε of the loss's expected-noise term: ``label_noise`` in ``expected`` mode, else 0."""
        return self.label_noise if self.label_noise_mode == "expected" else 0.0


@dataclass(frozen=True)
class Example:
    """One demonstration, tokenized.

    Attributes:
        env_name: The env that produced it.
        prompt_ids: The chat-template prompt (system, observation, generation prompt).
        answer_ids: The expert's answer tokens, the end-of-turn token included.
        action: The expert's action name.
        choice_index: Where in ``answer_ids`` the answers to the env's actions
            differ (the action token); None: no expected-noise loss.
        choice_ids: That token for every action of the env.
    """

    env_name: str
    prompt_ids: list[int]
    answer_ids: list[int]
    action: str
    choice_index: int | None = None
    choice_ids: tuple[int, ...] = ()


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
    from agentgym.envs.adapter import make_text_env

    env = make_text_env(name, kwargs)
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
    """Every env's demonstrations, tokenized as the rollout's ``step`` prompts.

    Raises:
        ValueError: If ``label_noise_mode`` is ``expected`` and an env's
            answers to its actions do not differ in exactly one token.
    """
    from agentgym.envs.adapter import make_text_env

    expected = spec.expected_noise > 0
    examples = []
    for offset, (name, kwargs) in enumerate(sorted(spec.envs.items())):
        pairs = expert_pairs(
            name,
            kwargs,
            spec.examples_per_env,
            explore=spec.explore,
            seed=spec.seed * 1_000_003 + offset * 100_003,
            label_noise=0.0 if expected else spec.label_noise,
        )
        choice_index: int | None = None
        choice_ids: tuple[int, ...] = ()
        if expected and pairs:
            env = make_text_env(name, kwargs)
            names, response_format = list(env.action_names), pairs[0][3]
            env.close()
            choice_index, choice_ids = action_choice(
                name, [answer_tokens(tokenizer, a, response_format) for a in names]
            )
        for instructions, observation, action, response_format in pairs:
            examples.append(
                Example(
                    env_name=name,
                    prompt_ids=prompt_ids(tokenizer, instructions, observation),
                    answer_ids=answer_tokens(tokenizer, action, response_format),
                    action=action,
                    choice_index=choice_index,
                    choice_ids=choice_ids,
                )
            )
    return examples


def answer_tokens(tokenizer: Any, action: str, response_format: str) -> list[int]:
    """The answer that plays ``action``, tokenized, the end-of-turn token included."""
    from agentgym.envs.scripted import format_response

    text = format_response([action], response_format)
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def action_choice(env_name: str, answers: Sequence[Sequence[int]]) -> tuple[int, tuple[int, ...]]:
    """Where the answers to an env's actions differ, and their tokens there.

    Raises:
        ValueError: If the answers differ in length or in more than one token.
    """
    lengths = {len(a) for a in answers}
    differ = [i for i in range(min(lengths)) if len({a[i] for a in answers}) > 1]
    if len(lengths) != 1 or len(differ) != 1 or len({a[differ[0]] for a in answers}) < len(answers):
        raise ValueError(
            f"warm start: env {env_name!r}'s answers to its actions do not differ in exactly "
            "one token, which label_noise_mode='expected' needs; set "
            "model.warm_start.label_noise_mode=sampled"
        )
    return differ[0], tuple(a[differ[0]] for a in answers)


def prompt_ids(tokenizer: Any, instructions: str, observation: str) -> list[int]:
    """The ``step``-mode prompt without history: system, observation, generation prompt."""
    messages = [
        {"role": "system", "content": instructions},
        {"role": "user", "content": observation},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def collate(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (answers only), ``[B, T]``,
    and each row's action token: ``choice_positions`` ``[B]`` (-1: none) and
    ``choice_ids`` ``[B, K]`` (every action's token there; -1 pads)."""
    rows = [e.prompt_ids + e.answer_ids for e in examples]
    width = max(len(row) for row in rows)
    choices = max((len(e.choice_ids) for e in examples), default=0)
    input_ids = torch.full((len(rows), width), pad_token_id)  # [B, T]
    labels = torch.full((len(rows), width), IGNORE_INDEX)  # [B, T]
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    choice_positions = torch.full((len(rows),), -1)  # [B]
    choice_ids = torch.full((len(rows), choices), -1)  # [B, K]
    for i, (example, row) in enumerate(zip(examples, rows, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(example.prompt_ids) : len(row)] = torch.tensor(example.answer_ids)
        attention_mask[i, : len(row)] = 1
        if example.choice_index is not None:
            choice_positions[i] = len(example.prompt_ids) + example.choice_index
            choice_ids[i, : len(example.choice_ids)] = torch.tensor(example.choice_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "choice_positions": choice_positions,
        "choice_ids": choice_ids,
    }


def answer_loss(
    model: Any, batch: Mapping[str, torch.Tensor], label_noise: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens (the scalar the warm start minimizes).

    At a row's action token (``choice_positions``) the cross-entropy is the
    ε-greedy demonstrator's expectation with ε = ``label_noise``:
    ``(1 - ε)·CE(label) + ε·mean_k CE(choice_ids[k])``.
    """
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits[:, :-1]  # [B, T-1, V]: position t predicts token t + 1
    logprobs = logits.float().log_softmax(-1)  # [B, T-1, V]
    labels = batch["labels"][:, 1:]  # [B, T-1]
    answer = labels != IGNORE_INDEX  # [B, T-1]
    nll = -logprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    rows = (batch["choice_positions"] >= 0).nonzero().squeeze(-1)  # [R]
    if label_noise > 0 and len(rows):
        at = batch["choice_positions"][rows] - 1  # [R]: the position that predicts the action
        ids = batch["choice_ids"][rows]  # [R, K]
        valid = ids >= 0  # [R, K]
        choice_nll = -logprobs[rows, at].gather(-1, ids.clamp(min=0))  # [R, K]
        uniform = (choice_nll * valid).sum(-1) / valid.sum(-1)  # [R]
        nll = nll.index_put((rows, at), (1 - label_noise) * nll[rows, at] + label_noise * uniform)
    return nll[answer].mean()


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
        batch = collate([examples[int(i)] for i in rows], pad)
        loss = answer_loss(model, batch, spec.expected_noise)
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
