"""Under ``distributed=ray`` each episode's session lives on the proxy server in an
engine actor's own process (beside its model), and records what the in-process proxy
and the env manager record, token for token."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.proxy.players import AgentSettings, ProxyPlayers
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.engines import spawn_engines
from agentgym.rollout.router import Router
from tests.proxy.test_proxy import config, play
from tests.rollout.test_engines import ray_cluster  # noqa: F401  (a fixture)


@pytest.mark.ray
def test_sessions_on_engine_actors_record_what_the_env_manager_records(
    ray_cluster: Any,  # noqa: F811  (the fixture imported above)
    tiny_model_dir: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    here = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    own = play(here, tokenizer, config("trajectory"), None)
    engines = spawn_engines(ray_cluster, 2, "hf", str(tiny_model_dir))
    router = Router(engines)
    players = ProxyPlayers(AgentSettings(), on_engines=True)
    try:
        proxied = play(router, tokenizer, config("trajectory"), players)
    finally:
        asyncio.run(router.close())
    assert proxied.metrics["all/failed"] == 0
    assert not players._servers  # no server in this process: every session was an engine's
    assert set(players.open_sessions) == {"actor_infer[0]", "actor_infer[1]"}
    assert set(players.open_sessions.values()) == {0}  # every session closed
    for ours, theirs in zip(own.trajectories, proxied.trajectories, strict=True):
        assert (ours.score, ours.termination_reason) == (theirs.score, theirs.termination_reason)
        for a, b in zip(ours.samples(), theirs.samples(), strict=True):
            assert a.input_ids == b.input_ids
            assert a.loss_mask == b.loss_mask
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
