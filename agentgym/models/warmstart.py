"""Supervised warm start: teach a fresh chat model the action format from the
envs' own experts.

The envs' solvers (``env.solve()``: Sokoban's A*, FrozenLake's BFS) label
states with a shortest plan's first action; envs whose expert writes whole
responses (``env.oracle_response()``: WebShop's shopper, the tool envs' tool
calls and answers) label each state with that response. Each (state, response)
pair becomes one example rendered exactly as the rollout's ``step`` mode
prompts it with ``history_length`` past turns: the env's instructions as the
system message, the kept turns and the observation (tool results as ``tool``
messages), the chat template's generation prompt, then the expert's response
(e.g. ``<answer>Up</answer>``) and the end-of-turn token, which alone carry
the loss. The warm start is meant to be short: the model learns the format and a
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

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym.envs.adapter import make_text_env
from agentgym.envs.scripted import format_response
from agentgym.progress import progress

if TYPE_CHECKING:  # torch is imported where the warm start trains: specs need none
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
            Every env needs a ``solve()`` or an ``oracle_response()`` method;
            ``explore`` and ``label_noise`` apply to the envs with a fixed
            action vocabulary and a solver.
        seed: Seeds the episodes, the exploration, the batches and the update.
        history_length: Past turns in each example's prompt, as the rollout's
            ``step`` mode keeps them (the run's ``history_length``).
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
    history_length: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "examples_per_env", "history_length"):
            if getattr(self, key) < (0 if key in ("steps", "history_length") else 1):
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


Message = dict[str, str]
"""A chat message: ``{"role": ..., "content": ...}``."""


@dataclass(frozen=True)
class Demonstration:
    """One expert turn, before tokenization.

    Attributes:
        messages: The turn's ``step``-mode prompt: the system message (the env's
            instructions), the kept past turns and the observation.
        response: The expert's response text.
        action: The expert's action name where the env has a solver (label
            noise replaces it), else the response.
    """

    messages: tuple[Message, ...]
    response: str
    action: str


def demonstrations(
    name: str,
    kwargs: Mapping[str, Any],
    count: int,
    *,
    explore: float,
    seed: int,
    label_noise: float = 0.0,
    history_length: int = 0,
) -> list[Demonstration]:
    """``count`` expert turns of env ``name``, each with its ``step``-mode prompt.

    Episodes are played from seeds ``seed, seed + 1, ...``. An env with a
    solver (``solve()``: the grid envs) is labelled with the solver's first
    action at every state (a random action instead, with probability
    ``label_noise``); with probability ``explore`` a random action is played
    instead of the solver's, and states the solver cannot solve (a Sokoban box
    in a corner, a FrozenLake hole) end the episode. An env whose expert writes
    whole responses (``oracle_response()``: WebShop, the tool envs) is played
    and labelled by it. Tool results come back as ``tool`` messages, other
    observations as ``user`` messages, as in the rollout.

    Raises:
        TypeError: If the env has neither ``solve()`` nor ``oracle_response()``.
    """
    env = make_text_env(name, kwargs)
    oracle = getattr(env, "oracle_response", None)
    solve = getattr(env, "solve", None)
    if not callable(oracle) and not callable(solve):
        env.close()
        raise TypeError(
            f"warm start: env {name!r} has no solve() and no oracle_response() to "
            "demonstrate with; leave it out of model.warm_start.envs"
        )
    rng = np.random.default_rng(seed)
    label_rng = np.random.default_rng([seed, 1])  # its own stream: the moves don't depend on it
    found: list[Demonstration] = []
    episode = seed
    bar = progress(count, f"demonstrations ({name})", enabled=sys.stderr.isatty())
    while len(found) < count:
        observation, _ = env.reset(seed=episode)
        episode += 1
        messages: list[Message] = [
            {"role": "system", "content": env.instructions},
            {"role": "user", "content": observation},
        ]
        done = False
        while not done and len(found) < count:
            if callable(oracle):
                response = label = played = str(oracle())
            elif callable(solve):
                plan = solve()
                if not plan:  # solved already, or unsolvable from here
                    break
                label = plan[0]
                if label_rng.random() < label_noise:
                    label = env.action_names[int(label_rng.integers(len(env.action_names)))]
                response = format_response([label], env.response_format)
                action = plan[0]
                if rng.random() < explore:
                    action = env.action_names[int(rng.integers(len(env.action_names)))]
                played = f"<answer>{action}</answer>"
            found.append(Demonstration(step_window(messages, history_length), response, label))
            bar.update(1)
            observation, _, terminated, truncated, info = env.step(played)
            messages += [{"role": "assistant", "content": played}]
            messages += observation_messages(observation, info)
            done = terminated or truncated
    bar.close()
    env.close()
    return found


def step_window(messages: Sequence[Message], history_length: int) -> tuple[Message, ...]:
    """The messages of a ``step``-mode prompt: the system message, the last
    ``history_length`` turns (each from the observation it answered) and the newest
    observation; the rule of the rollout's step prompts."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant or history_length == 0:
        start = assistant[-1] + 1 if assistant else 1
    else:
        start = assistant[-history_length:][0]
        while start > 1 and messages[start - 1]["role"] != "assistant":
            start -= 1  # keep the observation the first kept response answered
    return (messages[0], *messages[start:])


def observation_messages(observation: str, info: Mapping[str, Any]) -> list[Message]:
    """Tool results become ``tool`` messages; any other observation a ``user`` message."""
    results = info.get("tool_results")
    if results:
        return [{"role": "tool", "content": str(result)} for result in results]
    return [{"role": "user", "content": observation}]


def build_examples(tokenizer: Any, spec: WarmStartSpec) -> list[Example]:
    """Every env's demonstrations, tokenized as the rollout's ``step`` prompts.

    Raises:
        ValueError: If ``label_noise_mode`` is ``expected`` and a solver env's
            answers to its actions do not differ in exactly one token.
    """
    expected = spec.expected_noise > 0
    examples = []
    for offset, (name, kwargs) in enumerate(sorted(spec.envs.items())):
        env = make_text_env(name, kwargs)
        names, response_format, tools = list(env.action_names), env.response_format, env.tools
        solver = callable(getattr(env, "solve", None)) and not callable(
            getattr(env, "oracle_response", None)
        )
        env.close()
        found = demonstrations(
            name,
            kwargs,
            spec.examples_per_env,
            explore=spec.explore,
            seed=spec.seed * 1_000_003 + offset * 100_003,
            label_noise=0.0 if expected else spec.label_noise,
            history_length=spec.history_length,
        )
        choice_index: int | None = None
        choice_ids: tuple[int, ...] = ()
        if expected and solver and found:
            choice_index, choice_ids = action_choice(
                name, [answer_tokens(tokenizer, a, response_format) for a in names]
            )
        for demonstration in progress(found, f"tokenizing ({name})", enabled=sys.stderr.isatty()):
            examples.append(
                Example(
                    env_name=name,
                    prompt_ids=render_prompt(tokenizer, demonstration.messages, tools),
                    answer_ids=response_tokens(tokenizer, demonstration.response),
                    action=demonstration.action,
                    choice_index=choice_index,
                    choice_ids=choice_ids,
                )
            )
    return examples


def response_tokens(tokenizer: Any, response: str) -> list[int]:
    """A response, tokenized, the end-of-turn token included."""
    return [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]


def answer_tokens(tokenizer: Any, action: str, response_format: str) -> list[int]:
    """The answer that plays ``action``, tokenized, the end-of-turn token included."""
    return response_tokens(tokenizer, format_response([action], response_format))


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
    return render_prompt(tokenizer, messages)


def render_prompt(
    tokenizer: Any, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()
) -> list[int]:
    """``messages`` in the chat template with its generation prompt, tokenized
    (``tools``: the env's tool schemas, for templates that list them)."""
    text = tokenizer.apply_chat_template(
        list(messages), tools=list(tools) or None, tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def collate(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (answers only), ``[B, T]``,
    and each row's action token: ``choice_positions`` ``[B]`` (-1: none) and
    ``choice_ids`` ``[B, K]`` (every action's token there; -1 pads)."""
    import torch

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
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    torch.manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(  # the multi-tensor path: the same numbers, faster on CPU
        model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay, foreach=True
    )
    pad = int(model.config.pad_token_id)
    losses = []
    model.train()
    # a bar with its ETA on a terminal (the first run's longest wait)
    for _ in progress(range(spec.steps), "warm start", enabled=sys.stderr.isatty()):
        rows = torch.randint(len(examples), (spec.batch_size,), generator=generator)
        batch = collate([examples[int(i)] for i in rows], pad)
        loss = answer_loss(model, batch, spec.expected_noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def greedy_answers(
    model: Any, tokenizer: Any, examples: Sequence[Example], max_new_tokens: int = 8
) -> list[str]:
    """The model's greedy answer text to each example's prompt (end-of-turn token cut)."""
    import torch

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
