"""Envs behind HTTP: the ``http`` env plays a registered env on an env server
(``agentgym serve-env``) exactly as the env plays in process, many episodes at once;
a server that is down, slow, answers garbage or is killed mid-episode fails that
episode by name, never hangs it; resets wait for a server that is starting; and
training goes on past a server killed mid-step."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import agentgym
from agentgym.envs.adapter import make_text_env
from agentgym.envs.http import EnvServer, EnvServerError, EnvServerThread, HttpEnv
from agentgym.envs.http.protocol import plain
from agentgym.envs.http.server import env_config_kwargs
from agentgym.rollout.workers import uses_task_index
from tests.envs.trainrun import logged_steps, run_python
from tests.servers import free_port

DYING = Path(__file__).with_name("http_dying_server.py")
ROOT = Path(__file__).parents[2]


def random_actions(env: Any, rng: np.random.Generator, count: int) -> list[str]:
    """Valid moves, several moves in one answer, and text that does not parse."""
    names = list(env.action_names)
    choices = [f"<answer>{name}</answer>" for name in names]
    choices += [f"<answer>{names[0]} || {names[-1]}</answer>", "I think Up", ""]
    return [choices[int(rng.integers(len(choices)))] for _ in range(count)]


def play(env: Any, seed: int, actions: list[str]) -> list[Any]:
    """An episode's reset and steps, as JSON carries them."""
    record: list[Any] = [plain(env.reset(seed=seed))]
    for action in actions:
        outcome = env.step(action)
        record.append(plain(outcome))
        if outcome[2] or outcome[3]:
            break
    return record


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("sokoban", env_config_kwargs("sokoban")),
        ("frozen_lake", {"size": 4, "is_slippery": True, "max_steps": 12}),
        ("math_tool", {}),
    ],
)
def test_episodes_through_http_equal_the_env_in_process(name: str, kwargs: dict[str, Any]) -> None:
    local = make_text_env(name, kwargs)
    with EnvServerThread(EnvServer(name, kwargs)) as server:
        remote = HttpEnv(base_url=server.url, env=name, format_penalty=-0.3)
        local.format_penalty = -0.3  # what the client set on the server's env
        assert remote.instructions == local.instructions and remote.tools == local.tools
        rng = np.random.default_rng(0)
        for seed in range(20 if local.action_names else 3):  # the tool env runs Python
            actions = random_actions(local, rng, 12) if local.action_names else [
                '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
                "<answer>42</answer>",
            ]  # fmt: skip
            assert play(remote, seed, actions) == play(local, seed, actions), seed
        remote.close()
        assert server.server.episodes == {}  # close let the server close its env


def test_a_task_indexed_env_asks_for_its_task_indices_through_http() -> None:
    local = make_text_env("math_workflow", {})
    with EnvServerThread(EnvServer("math_workflow")) as server:
        remote = HttpEnv(base_url=server.url)
        assert uses_task_index(remote) and uses_task_index(local)  # the env manager asks
        for index in (0, 1, 7):
            options = {"task_index": index}
            assert plain(remote.reset(seed=index, options=options)) == plain(
                local.reset(seed=index, options=options)
            )
            answer = "<answer>42</answer>"
            assert plain(remote.step(answer)) == plain(local.step(answer))


def test_sixty_four_concurrent_episodes_on_one_server_each_equal_in_process() -> None:
    kwargs = env_config_kwargs("sokoban")
    with EnvServerThread(EnvServer("sokoban", kwargs)) as server:
        clients = [HttpEnv(base_url=server.url) for _ in range(64)]

        def episode(index: int) -> bool:
            local = make_text_env("sokoban", kwargs)
            actions = random_actions(local, np.random.default_rng(index), 10)
            return play(clients[index], index, actions) == play(local, index, actions)

        with ThreadPoolExecutor(16) as pool:
            assert all(pool.map(episode, range(64)))
        assert len(server.server.episodes) == 64
        for client in clients:
            client.close()
        assert server.server.episodes == {}


def test_env_http_works_from_its_name_on_a_loopback_server() -> None:
    env = agentgym.make("http").unwrapped
    assert isinstance(env, HttpEnv)
    local = make_text_env("sokoban", env_config_kwargs("sokoban"))
    actions = random_actions(local, np.random.default_rng(1), 8)
    assert play(env, 5, actions) == play(local, 5, actions)
    assert env.base_url.startswith("http://127.0.0.1:")


def test_a_client_may_set_only_textenvs_own_arguments_and_must_name_the_served_env() -> None:
    with EnvServerThread(EnvServer("sokoban", env_config_kwargs("sokoban"))) as server:
        with pytest.raises(EnvServerError, match=r"400 .*may not set \['dim_room'\]; it may"):
            HttpEnv(base_url=server.url, env_kwargs={"dim_room": [8, 8]})
        with pytest.raises(EnvServerError, match=r"serves env 'sokoban', not 'frozen_lake'"):
            HttpEnv(base_url=server.url, env="frozen_lake")
        env = HttpEnv(base_url=server.url, env_kwargs={"max_steps": 2})
        env.reset(seed=0)
        env.step("nonsense")
        assert env.step("nonsense")[3]  # truncated at the client's max_steps
        env._done = False  # a client that steps a finished episode: the env's own error
        with pytest.raises(EnvServerError, match=r"500 to step .*RuntimeError: step\(\) called"):
            env.step("nonsense")


def test_a_full_server_closes_idle_episodes_for_new_ones_and_else_answers_503() -> None:
    with EnvServerThread(EnvServer("sokoban", max_episodes=2, idle_timeout=0.3)) as server:
        first, second = HttpEnv(base_url=server.url), HttpEnv(base_url=server.url)
        second.reset(seed=0)
        with pytest.raises(EnvServerError, match=r"to open of episode .*last: it answered 503"):
            HttpEnv(base_url=server.url, connect_timeout=0.2)  # both in use
        time.sleep(0.4)
        third = HttpEnv(base_url=server.url)  # the idle ones make room
        assert set(server.server.episodes) == {third.episode_id}
        with pytest.raises(EnvServerError, match=r"404 to step .*holds no episode"):
            second.step("<answer>Up</answer>")  # closed while idle: that episode fails
        assert first.reset(seed=1)[0]  # a reset makes a closed episode's env again


def test_a_server_that_is_down_fails_within_connect_timeout_naming_it() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(
        EnvServerError, match=rf"base_url http://127\.0\.0\.1:{port} to health .* 0\.5 s"
    ):
        HttpEnv(base_url=f"http://127.0.0.1:{port}", connect_timeout=0.5)
    assert time.monotonic() - started < 3


def test_a_run_whose_server_is_unreachable_stops_before_model_work_naming_base_url(
    tmp_path: Path,
) -> None:
    port = free_port()
    result = run_python(
        ["-m", "agentgym.train", "env=http", f"env.kwargs.base_url=http://127.0.0.1:{port}",
         "env.kwargs.connect_timeout=1", f"model.cache_dir={tmp_path / 'cache'}",
         f"output_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(
        f"config error: env 'http' rejects its arguments (env.kwargs.base_url="
        f"'http://127.0.0.1:{port}'): EnvServerError: no answer from base_url"
    )
    assert not (tmp_path / "cache").exists()  # no model was built


def test_resets_wait_with_backoff_for_a_server_that_is_starting() -> None:
    port = free_port()
    servers: list[EnvServerThread] = []
    starter = threading.Timer(
        1.0, lambda: servers.append(EnvServerThread(EnvServer("sokoban"), port=port))
    )
    starter.start()
    try:
        env = HttpEnv(base_url=f"http://127.0.0.1:{port}", connect_timeout=30)  # waits
        observation, info = env.reset(seed=0)
        assert observation and info["action_is_valid"] is True
    finally:
        starter.join()
        for server in servers:
            server.close()


class FakeServer(http.server.BaseHTTPRequestHandler):
    """Answers health, open and reset as a server does, and each step as ``MODE`` says."""

    MODE = "garbage"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, json.dumps({"protocol": 1, "env": "sokoban", "episodes": 0}).encode())

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, json.dumps({"env": "sokoban", "instructions": "x", "tools": []}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/reset"):
            info = {"action_is_valid": True, "success": False}
            self._send(200, json.dumps({"observation": "room", "info": info}).encode())
        elif self.MODE == "garbage":
            self._send(200, b"<html>502 Bad Gateway</html>")
        elif self.MODE == "wrong_shape":
            self._send(200, json.dumps({"observation": 3, "reward": "high"}).encode())
        else:  # silent: never answers
            time.sleep(5)


@pytest.fixture
def fake_server() -> Iterator[tuple[str, type[FakeServer]]]:
    handler = type("Handler", (FakeServer,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", r"answered garbage to step .*\(status 200\): b'<html>502"),
        ("wrong_shape", r"answered garbage to step .*\"observation\": 3"),
        ("silent", r"failed during step .*TimeoutError: timed out"),
    ],
)
def test_garbage_or_silence_fails_the_step_by_name(
    mode: str, message: str, fake_server: tuple[str, type[FakeServer]]
) -> None:
    url, handler = fake_server
    handler.MODE = mode
    env = HttpEnv(base_url=url, timeout=0.5)
    env.reset(seed=0)
    started = time.monotonic()
    with pytest.raises(EnvServerError, match=message):
        env.step("<answer>Up</answer>")
    assert time.monotonic() - started < 3
    with pytest.raises(RuntimeError, match="call reset"):  # the failed step ended the episode
        env.step("<answer>Up</answer>")


def serve_env_process(port: int, *args: str) -> subprocess.Popen[str]:
    """``agentgym serve-env`` (its module) on ``port``, answering once it has started."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agentgym.envs.http.serve", "sokoban", "--port", str(port),
         *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline().startswith(f"serving sokoban on http://127.0.0.1:{port}")
    return process


def test_a_server_killed_mid_episode_fails_that_episode_and_the_next_reset_waits_for_it() -> None:
    port = free_port()
    processes = [serve_env_process(port)]
    try:
        env = HttpEnv(base_url=f"http://127.0.0.1:{port}", connect_timeout=30)
        env.reset(seed=0)
        env.step("<answer>Up</answer>")
        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait()
        started = time.monotonic()
        with pytest.raises(EnvServerError, match=rf"127\.0\.0\.1:{port} failed during step"):
            env.step("<answer>Up</answer>")
        assert time.monotonic() - started < 3
        threading.Timer(0.5, lambda: processes.append(serve_env_process(port))).start()
        observation, _ = env.reset(seed=0)  # retried until the new server answers
        assert (
            observation == make_text_env("sokoban", env_config_kwargs("sokoban")).reset(seed=0)[0]
        )
        env.close()
    finally:
        time.sleep(0.1)
        for process in processes:
            process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


def test_serve_env_refuses_an_unknown_env_or_bad_arguments_before_serving() -> None:
    def serve_env(*args: str) -> subprocess.CompletedProcess[str]:  # a fresh python: 0.5 s
        command = [sys.executable, "-m", "agentgym.cli", "serve-env", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    unknown = serve_env("sokobam")
    assert unknown.returncode == 2
    assert "Unknown env 'sokobam'. Did you mean 'sokoban'?" in unknown.stderr
    bad = serve_env("sokoban", "--port", "1", "dim_room=[2,2]")  # checked before it listens
    assert bad.returncode == 2
    assert "dim_room must be at least (3, 3), got (2, 2)" in bad.stderr


@pytest.mark.slow
def test_training_goes_on_past_a_server_killed_mid_step(tmp_path: Path) -> None:
    """The server dies once, under the first round of train step 1's episodes (each env
    plays two a step); the episodes it held fail by name and are counted, a supervisor
    starts it again, the second round's resets wait for it, and step 1 trains on that
    round's episodes; step 2 plays as usual: nothing hangs."""
    port, marker, log = free_port(), tmp_path / "died", tmp_path / "server.log"
    stop = threading.Event()
    lives: list[subprocess.Popen[bytes]] = []

    def supervise() -> None:  # what a process manager does: start it again when it dies
        with log.open("ab") as output:
            while not stop.is_set():
                command = [sys.executable, str(DYING), str(marker), "--port", str(port)]
                lives.append(subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=output))
                while lives[-1].poll() is None and not stop.is_set():
                    time.sleep(0.05)

    supervisor = threading.Thread(target=supervise)
    supervisor.start()
    try:
        result = run_python(
            ["-m", "agentgym.train", "env=http", f"env.kwargs.base_url=http://127.0.0.1:{port}",
             "env.kwargs.env=dying_sokoban", "max_steps=2", "eval_steps=0", "save_steps=2",
             "max_turns=3", "max_failed_fraction=1.0", "train_env_manager.env_groups=2",
             "train_env_manager.group_size=2", "train_env_manager.max_traj_per_env=2",
             "rollout_batch_size=8", "val_batch_size=2",
             "generation=hf", "model.warm_start=null", f"output_dir={tmp_path / 'run'}",
             f"model.cache_dir={tmp_path / 'cache'}",
             "actor_train.training_args.per_device_train_batch_size=2"],
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        stop.set()
        supervisor.join()
        for process in lives:
            process.kill()
            process.wait()
    assert result.returncode == 0, result.stderr[-4000:]
    assert marker.exists() and len(lives) >= 2  # it died, and was started again
    steps = logged_steps(tmp_path / "run")
    failed = [steps[step]["train/http/failed"] for step in (1, 2)]
    assert failed == [4.0, 0.0]  # the first round of step 1: the 4 episodes in flight
    assert steps[1]["train/http/trajectories"] == 8.0  # the failed ones are counted too
    assert all("actor/loss" in steps[step] for step in (1, 2))  # step 1 on its second round
    train_log = (tmp_path / "run" / "train.log").read_text()
    assert "4 episode(s) ended with env_error (agentgym.envs.http.protocol.EnvServerError)" in (
        train_log
    )
    assert f"the server at http://127.0.0.1:{port} failed during step" in train_log


def test_the_http_env_benchmark_runs_dry(tmp_path: Path) -> None:
    """benchmarks/http_env_bench.py in its dry mode: what it times works (not how fast)."""
    out = tmp_path / "figures.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "http_env_bench.py"), "--dry-run",
               "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    local, remote = figures["medians"]["in process"], figures["medians"]["http"]
    assert local["steps"] == remote["steps"] > 4  # the same moves played both ways
    assert remote["wall_ms_per_step"] > 0 and remote["latency_p50_ms"] > 0
    assert local["server_cpu_ms_per_step"] == 0  # no server in process (/proc's 10 ms ticks
    # are too coarse for the dry run's 40 steps to show the server's)
