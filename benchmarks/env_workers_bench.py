"""Helpers of the env-worker benchmarks: a CPU-bound tool env, managers in process
and on env workers, and a rollout with the scripted solver.

The anchor is today's rollout: every env in this process, stepped in the
loop's thread pool (one interpreter lock for all of them). The contender is
the same rollout with the envs on 2 env workers (Ray actors, a process each).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import agentgym
from agentgym.cluster import Cluster, start_cluster
from agentgym.envs.adapter import make_text_env
from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.scripted import make_agent
from agentgym.envs.text_env import TextEnv
from agentgym.models.tiny import build_tokenizer
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect

BENCHMARKS = Path(__file__).resolve().parent
WORKERS = 2

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def count_primes(limit: int) -> int:
    """Primes below ``limit`` by trial division: plain Python, holds the interpreter lock."""
    count = 0
    for candidate in range(2, limit):
        divisor = 2
        while divisor * divisor <= candidate:
            if candidate % divisor == 0:
                break
            divisor += 1
        else:
            count += 1
    return count


class PrimeToolEnv(TextEnv):
    """Count the primes below a number with the count_primes tool, then answer.

    The tool runs in the env's process and is pure Python (a few milliseconds a
    call), the kind of tool env whose steps threads cannot run in parallel.
    """

    action_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, low: int = 9000, high: int = 11000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.low, self.high = low, high

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "count_primes",
                    "description": "Count the primes below n.",
                    "parameters": {
                        "type": "object",
                        "properties": {"n": {"type": "integer"}},
                        "required": ["n"],
                    },
                },
            }
        ]

    @property
    def instructions(self) -> str:
        return "Use the count_primes tool, then give the count as <answer>N</answer>."

    def _parse(self, text: str) -> ParsedResponse:
        calls = _CALL.findall(text)
        if calls:
            return ParsedResponse(actions=tuple("call:" + c for c in calls), is_valid=True)
        answer = _ANSWER.search(text)
        if answer:
            return ParsedResponse(actions=("answer:" + answer.group(1).strip(),), is_valid=True)
        return ParsedResponse(actions=(), is_valid=False, error="no tool call or answer")

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.n = int(self.np_random.integers(self.low, self.high))
        self.results: list[str] = []
        self.answered: str | None = None
        self.truth: int | None = None
        return {}

    def _apply(self, action: str) -> tuple[float, bool]:
        kind, _, payload = action.partition(":")
        if kind == "answer":
            self.answered = payload
            return float(self._success()), True
        try:
            n = int(json.loads(payload)["arguments"]["n"])
        except (ValueError, KeyError, TypeError) as error:
            self.results.append(f"error: {error}")
            return 0.0, False
        count = count_primes(n)
        if n == self.n:
            self.truth = count
        self.results.append(str(count))
        return 0.0, False

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.results = []
        observation, reward, terminated, truncated, info = super().step(action)
        if self.results:
            info["tool_results"] = list(self.results)
        return observation, reward, terminated, truncated, info

    def _observation(self) -> str:
        return " ".join(self.results) or f"How many primes are below {self.n}?"

    def _success(self) -> bool:
        if self.answered is None:
            return False
        if self.truth is None:
            self.truth = count_primes(self.n)
        return self.answered == str(self.truth)

    def oracle_response(self) -> str:
        if self.num_steps == 0:
            call = {"name": "count_primes", "arguments": {"n": self.n}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return f"<answer>{self.results[0] if self.results else ''}</answer>"


@contextmanager
def ray_cluster() -> Iterator[Cluster]:
    """A local Ray instance whose workers can import this folder's env classes."""
    cluster = start_cluster("ray", rpc_timeout=600, env_vars={"PYTHONPATH": str(BENCHMARKS)})
    try:
        yield cluster
    finally:
        cluster.shutdown()


@dataclass(frozen=True)
class Rollout:
    """A manager and what a scripted-solver rollout of it needs."""

    manager: EnvManager
    chat: ChatTokenizer
    backend: ScriptedBackend
    config: RolloutConfig

    def run(self) -> int:
        """One collection; returns the env-turns played."""
        result = asyncio.run(collect(self.manager, self.backend, self.chat, self.config))
        return sum(len(t.turns) for t in result.trajectories)


def solver_rollout(
    name: str,
    kwargs: Mapping[str, Any],
    *,
    envs: int,
    episodes_per_env: int,
    cluster: Cluster | None,
    max_turns: int = 15,
) -> Rollout:
    """A rollout of ``envs`` envs of ``name`` with the scripted solver (the env's oracle).

    The tokenizer is a small BPE trained on the env's own text (solver episodes
    of one env built here). With a cluster, the envs go to :data:`WORKERS` workers.
    """
    if name == "prime_tool" and name not in agentgym.list_envs():
        agentgym.register(name, PrimeToolEnv)
    probe = make_text_env(name, kwargs)
    agent = make_agent("solver")
    corpus = [probe.instructions]
    for seed in range(16):
        observation, _ = probe.reset(seed=seed)
        agent.reset(probe)
        corpus.append(observation)
        for _ in range(max_turns):
            response = agent.act(probe)
            observation, _, terminated, truncated, _ = probe.step(response)
            corpus += [response, observation]
            if terminated or truncated:
                break
    probe.close()
    tokenizer = build_tokenizer(corpus * 2, 2000, "chatml")
    manager = EnvManager(
        tags=[name],
        env_groups=envs,
        group_size=1,
        env_configs={name: {"name": name, "kwargs": dict(kwargs)}},
        max_traj_per_env=episodes_per_env,
        cluster=cluster,
        max_env_num_per_worker=None if cluster is None else -(-envs // WORKERS),
    )
    config = RolloutConfig(
        mode="trajectory", max_turns=max_turns, sequence_length=1 << 20, prefix_check="off"
    )
    return Rollout(manager, ChatTokenizer(tokenizer), ScriptedBackend(tokenizer), config)


def turns_per_second(rollout: Rollout, rounds: int = 3) -> float:
    """The best of ``rounds`` collections (after a warm-up), in env-turns per second."""
    rollout.run()
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        turns = rollout.run()
        best = max(best, turns / (time.perf_counter() - start))
    return best
