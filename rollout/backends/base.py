"""The generation backend protocol and its data."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv


class GenerationError(RuntimeError):
    """A backend could not generate (server down, engine dead, bad request)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response.

    Attributes:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass; 1.0 disables it.
        top_k: Keep the k most likely tokens; 0 or less disables it.
        max_new_tokens: The most tokens generated for one response.
        stop_token_ids: Generation ends after any of these (they are kept in
            the output, like an end-of-turn token).
        seed: Per-request sampling seed where the backend supports one.
        stop_strings: A response ends with the first of these it writes (kept in it;
            the rollout cuts it there, :mod:`agentgym.rollout.stop_strings`).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class Generation:
    """One generated response.

    Attributes:
        token_ids: The generated ids, the final stop token included if one was hit.
        logprobs: Log-probability of each generated id under the distribution it
            was sampled from: the model's logits divided by the temperature, with
            top-k/top-p applied (vLLM's ``processed_logprobs``).
        finish_reason: ``"stop"`` or ``"length"``.
        policy_version: The weights version that generated it, when the client
            knows (:class:`~agentgym.rollout.async_rollout.PausableBackend` sets it);
            None: the rollout's own version. For a response continued across weight
            syncs (``partial_rollout``), the version of its first token.
        token_versions: The version of each generated id, when a response was continued
            across weight syncs (``partial_rollout``); None: all ``policy_version``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int | None = None
    token_versions: list[int] | None = None


@runtime_checkable
class GenerationBackend(Protocol):
    """Generates responses for token prompts, asynchronously.

    Callers submit many requests concurrently; the backend batches whatever is
    pending. ``env`` is the env the request plays in: model backends ignore it;
    scripted policies read its state.
    """

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Generate one response to ``prompt_ids``."""
        ...

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new policy weights (by parameter name, in Hugging Face naming)."""
        ...

    async def close(self) -> None:
        """Release the engine, threads, connections."""
        ...
