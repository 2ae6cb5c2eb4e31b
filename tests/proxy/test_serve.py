"""``mode=serve`` (Trinity-RFT's serving explorer) with ``mode=train`` and an agent that
someone else started, as three real processes of one job: every session the agent
finished is trained exactly once, with the reward it reported."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import httpx
import pytest

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
