"""``mode=serve`` (Trinity-RFT's serving explorer) with ``mode=train`` and an agent that
someone else started, as three real processes of one job: every session the agent
finished is trained exactly once, with the reward it reported."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.job.buffer import ExperienceBuffer
from agentgym.job.published_weights import FolderChannel
from agentgym.proxy.serve import ServeParts, ServingExplorer
from agentgym.proxy.turns import TakingTurns
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.loop import RolloutConfig
from agentgym.trajectory import Trajectory
from tests.forkserver import start_python
from tests.test_explorer_trainer import (  # noqa: F401  (no_process_left: a fixture)
    STARTED,
    assert_each_group_once,
    buffer,
    finish,
    metrics,
    no_process_left,
    start,
    wait_for,
)

AGENT = Path(__file__).with_name("outside_agent.py")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_an_outside_agent_trains_through_a_serving_explorer(tmp_path: Path, cache: Path) -> None:
    settings = ("max_steps=2", "agent.timeout=120", "explorer.name=server")
    trainer = start(tmp_path, cache, "train", *settings)
    server = start(tmp_path, cache, "serve", *settings)
    address = tmp_path / "jobs" / "p" / "job" / "serve" / "server.json"
    sessions = tmp_path / "sessions.jsonl"
    command = [str(AGENT), str(address), str(sessions), "2", "2"]
    STARTED.append(start_python(command, cwd=Path.cwd(), output=tmp_path / "agent.log"))
    agent = STARTED[-1]
    wait_for(address)
    served = json.loads(address.read_text())
    assert address.stat().st_mode & 0o077 == 0  # the key is its owner's only
    wrong = httpx.post(served["sessions"], headers={"Authorization": "Bearer no"}, json={})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    finish(trainer, tmp_path / "train.log")
    finish(server, tmp_path / "serve.log")
    assert agent.wait(120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    assert not address.exists()  # the explorer took its address with it

    assert_each_group_once(tmp_path, 2)
    store = buffer(tmp_path)
    groups = [store.consumed_by_step()[step] for step in (1, 2)]
    assert [explorer for step in groups for explorer, _ in step] == ["server"] * 4
    trained: list[Trajectory] = []
    for (payload,) in store._db.execute("SELECT payload FROM groups WHERE state = 'consumed'"):
        members = pickle.loads(payload)
        assert len(members) == 2 and len({t.seed for t in members}) == 1  # one room a group
        trained += members
    finished = [json.loads(line) for line in sessions.read_text().splitlines()]
    assert sorted((t.seed, t.score) for t in trained) == sorted(
        (s["room"], s["reward"]) for s in finished
    )
    assert all(t.turns and not t.failed for t in trained)
    turns = [turn for t in trained for turn in t.turns]
    assert all(len(turn.logprobs) == len(turn.response_ids) > 0 for turn in turns)
    # each group was opened at the version loaded then: groups of step 2 after version 1
    assert {t.policy_version for t in trained} <= {0, 1}
    rows = metrics(tmp_path / "serve")
    written = [row for row in rows.values() if "serve/groups_written" in row]
    assert max(row["serve/groups_written"] for row in written) == 4
    assert any("val/all/success" in row for row in rows.values())  # it validates as it serves
    log = (tmp_path / "serve.log").read_text()
    assert "loaded version 1" in log and "4 groups served" in log


class Records:
    """A tracker that keeps what it is given."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))

    def close(self) -> None:
        pass


def test_sessions_wait_for_room_expire_without_feedback_and_late_calls_are_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    channel = FolderChannel(tmp_path)
    records = Records()
    parts = ServeParts(
        name="server", job_dir=tmp_path, buffer=ExperienceBuffer(tmp_path / "buffer.sqlite"),
        weights=channel, backend=HFBackend(model, pad_token_id=tokenizer.pad_token_id),
        chat=ChatTokenizer(tokenizer),
        config=RolloutConfig(mode="trajectory", max_turns=3, sequence_length=2048,
                             sampling=SamplingParams(max_new_tokens=4, seed=0)),
        val=None, tracker=records, ratio=0.0, group_size=2, max_steps=1, eval_steps=0,  # type: ignore[arg-type]
        eval_on_startup=False, sync_timeout=60.0, host="127.0.0.1", port=0, api_key="k",
        timeout=1.5, close=lambda: None,
    )  # fmt: skip
    explorer = ServingExplorer(parts, log=lambda line: None)
    auth = {"Authorization": "Bearer k"}
    hello = [{"role": "user", "content": "hello"}]

    async def scenario() -> None:
        following = asyncio.ensure_future(explorer.follow())
        while explorer.server._server is None or not explorer.server._server.started:
            await asyncio.sleep(0.01)
        url = explorer.server.url
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=30) as client:
            # no weights yet: no room; the opener is told so after agent.timeout
            waited = await client.post("/sessions", json={"task": "a"})
            assert waited.status_code == 503 and waited.json()["error"]["code"] == "busy"
            channel.store(0, dict(model.state_dict()), groups_per_step=1)
            first, second = [
                (await client.post("/sessions", json={"task": "a"})).json() for _ in range(2)
            ]
            for session in (first, second):
                reply = await client.post(
                    f"{session['base_url']}/chat/completions", json={"messages": hello}
                )
                assert reply.status_code == 200, reply.text
            done = await client.post(f"/s/{first['session']}/feedback", json={"reward": 1.0})
            assert done.status_code == 200
            late = await client.post(
                f"{first['base_url']}/chat/completions", json={"messages": hello}
            )
            assert late.status_code == 410
            # the bound (and the trainer's one step) leave room for this one group only;
            # meanwhile the second session, never reporting, expires
            other = await client.post("/sessions", json={"task": "b"})
            assert other.status_code == 503
            # the group is written with the expired session failed
            deadline = time.monotonic() + 30
            while parts.buffer.counts()["ready"] < 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            channel.finish(0)
            assert await asyncio.wait_for(following, 30) == 1

    asyncio.run(scenario())
    (members,) = parts.buffer.lease(1, 1) or []
    assert [t.score for t in members] == [1.0, 0.0]
    assert members[0].turns and not members[0].failed
    assert members[1].termination_reason == "agent_error" and "agent.timeout" in str(
        members[1].error
    )
    assert {t.policy_version for t in members} == {0}
    assert records.rows[-1][1]["serve/sessions_expired"] == 1.0
    assert not (tmp_path / "serve" / "server.json").exists()


def test_a_weight_load_waits_for_generations_in_flight_and_holds_new_ones() -> None:
    turns = TakingTurns()
    events: list[str] = []

    async def generate(name: str, seconds: float) -> None:
        async with turns.generation():
            events.append(f"{name} starts")
            await asyncio.sleep(seconds)
            events.append(f"{name} ends")

    async def load() -> None:
        async with turns.load():
            events.append("load starts")
            await asyncio.sleep(0.05)
            events.append("load ends")

    async def scenario() -> None:
        first = asyncio.ensure_future(generate("first", 0.1))
        await asyncio.sleep(0.01)
        loading = asyncio.ensure_future(load())
        await asyncio.sleep(0.01)
        later = asyncio.ensure_future(generate("later", 0.01))
        await asyncio.gather(first, loading, later)

    asyncio.run(scenario())
    assert events == [
        "first starts", "first ends", "load starts", "load ends", "later starts", "later ends",
    ]  # fmt: skip
