"""``mcp_tools``: the tools of a real MCP server process (tests/envs/mcp_calculator.py,
the official ``mcp`` SDK) over stdio and streamable HTTP; slow calls time out, a server
that dies fails its episode by name and is started again for the next; and the env
trains 2 steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import agentgym
from agentgym.envs.tools.tools import ToolServerDiedError
from tests.forkserver import run_python
from tests.servers import free_port
from tests.trainers.test_train_e2e import SMALL

SERVER = Path(__file__).with_name("mcp_calculator.py")
ROWS = [
    {"prompt": "What is 12.5 plus 30?", "response": "42.5"},
    {"prompt": "What is 6 times 7?", "response": "42"},
]


def call(name: str, **arguments: float) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_the_servers_tools_reach_the_model_and_answer(tasks: Path) -> None:
    env = agentgym.make("mcp_tools", server=f"python {SERVER}", tasks=str(tasks))
    try:
        schemas = {t["function"]["name"]: t["function"] for t in env.unwrapped.tools}  # type: ignore[attr-defined]
        assert set(schemas) == {"add", "subtract", "multiply", "slow", "crash"}
        assert schemas["add"]["parameters"]["required"] == ["a", "b"]
        assert schemas["multiply"]["description"] == "Multiply two numbers."  # the server's
        env.reset(seed=0, options={"task_index": 1})
        observation, _, _, _, info = env.step(call("multiply", a=6, b=7))
        assert info["tool_results"] == ["42"] and "42" in observation
        _, reward, terminated, _, info = env.step("<answer>42</answer>")
        assert (reward, terminated, info["success"]) == (1.0, True, True)
    finally:
        env.close()


def test_a_slow_call_times_out_and_a_dead_server_fails_its_episode_then_restarts(
    tasks: Path,
) -> None:
    env = agentgym.make("mcp_tools", server=f"python {SERVER}", tasks=str(tasks), call_timeout=1.0)
    try:
        env.reset(seed=0)
        started = time.monotonic()
        _, _, _, _, info = env.step(call("slow", seconds=30))
        assert time.monotonic() - started < 10
        assert "did not answer within 1 s" in info["tool_results"][0]
        with pytest.raises(ToolServerDiedError, match=r"mcp_calculator\.py"):
            env.step(call("crash"))
        _, info = env.reset(seed=1)  # the next episode starts the server again
        assert info["server_restarts"] == 1
        _, _, _, _, info = env.step(call("add", a=1, b=2))
        assert info["tool_results"] == ["3"]
    finally:
        env.close()


@pytest.fixture
def http_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.2)
        yield url
    finally:
        process.kill()
        process.wait()


def test_a_server_over_streamable_http(tasks: Path, http_server: str) -> None:
    env = agentgym.make("mcp_tools", server=http_server, tasks=str(tasks))
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(call("add", a=12.5, b=30))
        assert info["tool_results"] == ["42.5"]
    finally:
        env.close()


def test_a_server_that_cannot_start_is_named(tasks: Path) -> None:
    with pytest.raises(ToolServerDiedError, match=r"no_such_server\.py"):
        agentgym.make("mcp_tools", server="python no_such_server.py", tasks=str(tasks))


def test_the_env_trains_two_steps_on_an_mcp_server(tmp_path: Path, tasks: Path) -> None:
    small = [item.format(cache=tmp_path / "cache") for item in SMALL if not item.startswith("env=")]
    output = tmp_path / "run"
    arguments = [
        "env=mcp_tools", f"env.kwargs.server='python {SERVER}'", f"env.kwargs.tasks={tasks}",
        *small, "max_steps=2", "eval_steps=2", "save_steps=2", "generation=hf",
        "train_env_manager.env_groups=1", "rollout_batch_size=4",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1", f"output_dir={output}",
    ]  # fmt: skip
    result = run_python(["-m", "agentgym.train", *arguments], cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    trained = [r for r in records if "train/all/trajectories" in r or "actor/pg_loss" in r]
    assert {r["step"] for r in trained} >= {1, 2}
    assert any("val/all/success" in r for r in records)
