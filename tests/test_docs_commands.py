"""Every example command of the docs runs, shortened to a step or two, and does
what its text says: the ``bash`` blocks of README.md and of the pages in docs/.
A command that names no engine runs on the HF engine, except the main one
(``env=sokoban``), which keeps the default vLLM: vLLM's start and stop cost about
20 s a command on this CPU, and the engine is tested on its own in tests/rollout/.
(The commands of docs/envs.md's "Your own envs" need the docs' plugin packages:
tests/envs/test_docs.py runs those.) A command shown on two pages runs once."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.forkserver import run_python
from tests.servers import free_port, running_server

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIPPED_SECTIONS = {"envs.md": "## Your own envs"}

# A step or two on the tiny model: the keys a training example does not set itself.
FAST = {
    "env": "sokoban",
    "max_steps": "2",
    "save_steps": "1",
    "eval_steps": "2",
    "max_turns": "2",
    "train_env_manager.env_groups": "2",
    "train_env_manager.group_size": "4",
    "rollout_batch_size": "8",
    "val_batch_size": "2",
    "val_env_manager.env_groups": "2",
    "actor_train.training_args.per_device_train_batch_size": "4",
    "actor_train.training_args.gradient_accumulation_steps": "2",
    "model.warm_start": "null",
}


def without_section(text: str, heading: str) -> str:
    """``text`` less the section under ``heading``, up to the next heading of its level or above."""
    start = text.index(heading)
    level = len(heading.split(" ", 1)[0])
    # from "##" on: a line that starts with "# " may be a comment in a code block
    marks = ("#" * n + " " for n in range(2, level + 1))
    ends = [text.find(f"\n{mark}", start + len(heading)) for mark in marks]
    end = min((e for e in ends if e >= 0), default=len(text))
    return text[:start] + text[end:]


def page_commands(text: str) -> list[str]:
    """The shell commands of a page's bash blocks (continuations joined, comments cut)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if "-m agentgym." in command or "-m vllm." in command:
                found.append(" ".join(command.split()))
    return found


def docs_commands() -> list[str]:
    """Every page's commands, each once."""
    found = []
    for page in PAGES:
        text = page.read_text()
        if page.name in SKIPPED_SECTIONS:
            text = without_section(text, SKIPPED_SECTIONS[page.name])
        found += page_commands(text)
    return list(dict.fromkeys(found))


COMMANDS = docs_commands()
SERVER = next(c for c in COMMANDS if "-m vllm.entrypoints" in c)
MAIN = "python -m agentgym.train env=sokoban"  # runs with the default engine as written


def on_hf(words: list[str], command: str) -> list[str]:
    """``words`` with ``generation=hf`` where the command names no engine (and is not MAIN)."""
    if (
        command == MAIN
        or "--config-path" in words
        or any(w.startswith(("generation=", "agent=")) for w in words)
    ):
        return words
    return [*words, "generation=hf"]


def split(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading ``VAR=value`` assignments and the argument list."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The README's vLLM server command, on a free port, serving the tiny model."""
    if os.environ.get("AGENTGYM_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    port = free_port()
    command = SERVER.replace("DIR", str(tiny_model_dir)).replace("8000", str(port))
    env, words = split(command.replace("NAME", "tiny"))
    words[0] = sys.executable if words[0] == "python" else words[0]
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(words, {**os.environ, **env}, log, f"http://127.0.0.1:{port}") as url:
        yield url


@pytest.fixture(scope="module")
def env_server() -> Iterator[str]:
    """``agentgym serve-env sokoban`` as docs/http_envs.md starts it, on a free port (in a
    thread of this process: the same server, without a process to clean up)."""
    from agentgym.envs.http.server import EnvServer, EnvServerThread, env_config_kwargs

    with EnvServerThread(EnvServer("sokoban", env_config_kwargs("sokoban"))) as server:
        yield server.url


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short training run for the examples that evaluate one (RUN)."""
    root = tmp_path_factory.mktemp("docs-run")
    words = ["-m", "agentgym.train", *(f"{k}={v}" for k, v in FAST.items())]
    cache = root / "cache"
    words += [f"model.cache_dir={cache}", "generation=hf", f"output_dir={root / 'run'}"]
    result = run_python(words, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run"


def shortened(words: list[str], tmp_path: Path) -> list[str]:
    """A training command with FAST's values for the keys it does not set (and its
    own step count cut to FAST's)."""
    own = {w.split("=", 1)[0] for w in words if "=" in w}
    batch = ("actor_train.training_args.per_device_train_batch_size",
             "actor_train.training_args.gradient_accumulation_steps")  # fmt: skip
    keep = {"max_steps", "rollout_batch_size", *batch} & own
    words = [w for w in words if w.split("=", 1)[0] not in keep]
    fast = [f"{k}={v}" for k, v in FAST.items() if k not in own or k in keep]
    if "env" in own:  # the command's env sets its own kwargs
        fast = [w for w in fast if not w.startswith("env=")]
    if not any(w.startswith("output_dir=") for w in words):
        fast.append(f"output_dir={tmp_path / 'run'}")
    return [*words, *fast, f"model.cache_dir={tmp_path / 'cache'}"]


def localized(command: str, tiny_model_dir: Path, run_dir: Path, tmp_path: Path) -> list[str]:
    """The command with its placeholders filled in and its paths inside ``tmp_path``."""
    command = command.replace("/models/Qwen2.5-0.5B-Instruct", str(tiny_model_dir))
    command = re.sub(r"\bDIR\b", str(tiny_model_dir), command)
    command = re.sub(r"\bRUN\b", str(run_dir), command).replace("NAME", "tiny")
    command = command.replace("output_dir=runs/", f"output_dir={tmp_path}/runs/")
    command = command.replace("$PWD/", f"{ROOT}/")  # the repository's own files
    import torch

    if not torch.cuda.is_available():  # the GPU example, on this machine's CPU
        command = command.replace("model.device=cuda", "model.device=cpu")
        command = command.replace("model.dtype=bfloat16", "model.dtype=float32")
    _, words = split(command)
    words[:1] = [sys.executable] if words[0] in ("python", ".venv/bin/python") else words[:1]
    return words


@dataclass(frozen=True)
class Played:
    """A command as run: its folder, its words, its stdout, and why it failed (None: it
    exited 0)."""

    folder: Path
    words: list[str]
    stdout: str
    failure: str | None


def play(command: str, folder: Path, tiny_model_dir: Path, run_dir: Path) -> Played:
    """Run ``command`` (placeholders filled, shortened) in ``folder``."""
    words = localized(command, tiny_model_dir, run_dir, folder)
    assert words[:2] == [sys.executable, "-m"], words  # run_python(words[1:]) below
    module = words[2]
    if module in ("agentgym.train", "agentgym.eval"):
        words = on_hf(words, command)
    stdin = ""
    if module == "agentgym.play":
        stdin = ":q\n"
    elif module == "agentgym.eval":
        words.append(f"hydra.run.dir={folder / 'eval'}")
    elif module == "agentgym.train" and "--config-path" not in words:
        words = shortened(words, folder)  # a --config-path file brings its own sizes
        if "resume_from_checkpoint=true" in words:  # the run it continues comes first
            first = [w for w in words if w != "resume_from_checkpoint=true"]
            first = [w if not w.startswith("max_steps=") else "max_steps=1" for w in first]
            done = run_python(first[1:], cwd=folder)
            if done.returncode != 0:
                return Played(folder, first, done.stdout, done.stderr[-3000:])
        if "rollout_mock.mode=mock" in words:  # the dump it replays comes first
            first = [
                "rollout_mock.mode=dump" if w == "rollout_mock.mode=mock"
                else f"{w}-dump" if w.startswith("output_dir=") else w
                for w in words
            ]  # fmt: skip
            done = run_python(first[1:], cwd=folder)
            if done.returncode != 0:
                return Played(folder, first, done.stdout, done.stderr[-3000:])
    result = run_python(words[1:], cwd=folder, input=stdin)
    failure = f"{' '.join(words)}\n{result.stderr[-3000:]}" if result.returncode else None
    return Played(folder, words, result.stdout, failure)


ON_RAY = [c for c in COMMANDS if "distributed=ray" in c]
"""The commands that start Ray: tests/test_docs_ray_commands.py runs them, in the
suite's one worker for Ray tests (tests/conftest.py)."""

ENV_SERVER = "env.kwargs.base_url=http://127.0.0.1:8000"
"""A command that plays on the env server its page starts first (docs/http_envs.md's
``agentgym serve-env sokoban --port 8000 &``): the test starts it (:func:`env_server`)."""

ALONE = [
    c
    for c in COMMANDS
    if c != SERVER
    and "RUN" not in c
    and "generation=openai" not in c
    and ENV_SERVER not in c
    and c not in ON_RAY
]
"""The commands that need neither a training run, a server nor Ray: played ahead,
two at a time."""


@pytest.fixture(scope="module")
def played(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Played]:
    """Every command of :data:`ALONE`, two at a time (separate processes, each mostly
    one core's Python), each in a folder of its own."""
    root = tmp_path_factory.mktemp("docs-commands")
    folders = {command: root / str(i) for i, command in enumerate(ALONE)}
    for folder in folders.values():
        folder.mkdir()

    def one(command: str) -> Played:
        return play(command, folders[command], tiny_model_dir, folders[command])

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {command: pool.submit(one, command) for command in ALONE}
        return {command: future.result() for command, future in futures.items()}


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != SERVER and c not in ON_RAY])
def test_docs_command(
    command: str, tmp_path: Path, tiny_model_dir: Path, request: pytest.FixtureRequest
) -> None:
    if command in ALONE:
        outcome: Played = request.getfixturevalue("played")[command]
    else:
        run_dir = request.getfixturevalue("run_dir") if "RUN" in command else tmp_path
        written = command
        if "generation=openai" in command:
            written = command.replace("http://127.0.0.1:8000", request.getfixturevalue("server"))
        if ENV_SERVER in command:
            url = request.getfixturevalue("env_server")
            written = command.replace("http://127.0.0.1:8000", url)
        outcome = play(written, tmp_path, tiny_model_dir, run_dir)
    assert_as_documented(outcome, command)


def assert_as_documented(outcome: Played, command: str) -> None:
    """The command exited 0 and did what its page says."""
    assert outcome.failure is None, outcome.failure
    module = outcome.words[2]
    if module == "agentgym.eval":
        report = json.loads((outcome.folder / "eval" / "eval.json").read_text())
        assert report["metrics"]["all/failed"] == 0
        solver = "agent=solver" in command or not re.search(r"agent=|model\.path=", command)
        if solver:
            assert report["metrics"]["all/success"] == 1.0  # the solver solves every room
    if module == "agentgym.train":
        assert "validation success: " in outcome.stdout
        if "resume_from_checkpoint=true" in command:
            assert "resumed from " in outcome.stdout


def test_each_page_with_examples_is_read() -> None:
    """A renamed page or section would drop its commands from this test silently."""
    found = {page.name: page_commands(page.read_text()) for page in PAGES}
    assert found["README.md"] == []  # the front page runs make run and make test only
    pages = ("getting_started.md", "envs.md", "rollout.md", "training.md", "scaling_out.md",
             "async.md", "benchmarks.md", "coming_from.md")  # fmt: skip
    assert all(found[name] for name in pages), {name: found[name] for name in pages}
    assert "python -m agentgym.play sokoban --seed 3" in COMMANDS
    assert MAIN in COMMANDS  # the one training command left on the default engine
    assert not any("coin" in command for command in COMMANDS)  # tests/envs/test_docs.py's
