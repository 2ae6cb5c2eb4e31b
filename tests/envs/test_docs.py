"""Every command of the env docs runs: CONTRIBUTING.md's "Register it" and "Check it"
sections and docs/envs.md's "Your own envs".

The plugin packages are built from the docs' own code blocks (NumberLineEnv,
CoinEnv, their ``pyproject.toml`` and Coin's ``registration.py``). Each
``bash`` line then runs, with three changes a test needs: ``pip install -e
DIR`` installs into a private folder (``--target``, no dependencies, no
build isolation) instead of the project's environment; ``play`` reads a few
typed lines; ``eval`` and ``train`` write into a temporary folder, and
``train`` runs two fast steps (``tests/envs/trainrun.py``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.envs.trainrun import logged_steps, run_python, train_two_steps

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
ENVS_PAGE = (ROOT / "docs" / "envs.md").read_text()
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
TYPED = {"number_line": "right\nleft\n:q\n", "coin": "heads\ntails\n:q\n"}


def between(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def block_with(text: str, language: str, needle: str) -> str:
    (found,) = [body for body in blocks(text, language) if needle in body]
    return found


def commands(text: str) -> list[list[str]]:
    """The command lines of the ``bash`` blocks, comments removed."""
    lines = [line for body in blocks(text, "bash") for line in body.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


CONTRIBUTING_COMMANDS = commands(
    between(CONTRIBUTING, "### 2.2 Register it", "`eval` prints success rate")
)
ENVS_PAGE_COMMANDS = commands(between(ENVS_PAGE, "## Your own envs", "## Sokoban rooms"))


def write_packages(root: Path) -> None:
    """agentgym-number-line and agentgym-coin, from the code blocks of CONTRIBUTING.md."""
    packages = {
        "agentgym-number-line": (
            "number_line",
            {"env.py": block_with(CONTRIBUTING, "python", "class NumberLineEnv(TextEnv)")},
        ),
        "agentgym-coin": (
            "coin",
            {
                "env.py": block_with(CONTRIBUTING, "python", "class CoinEnv(gymnasium.Env"),
                "registration.py": block_with(CONTRIBUTING, "python", "# src/coin/registration.py"),
            },
        ),
    }
    for folder, (module, files) in packages.items():
        source = root / folder / "src" / module
        source.mkdir(parents=True)
        (source / "__init__.py").write_text("")
        for name, text in files.items():
            (source / name).write_text(text)
        pyproject = block_with(CONTRIBUTING, "toml", f'name = "{folder}"')
        (root / folder / "pyproject.toml").write_text(pyproject)


@pytest.fixture(scope="module")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the docs' ``pip install`` commands install to."""
    root = tmp_path_factory.mktemp("docs")
    write_packages(root)
    return root


def run_command(args: list[str], root: Path, model_cache: Path, index: int) -> str:
    site = root / "site"
    if args[0] == "pip":
        assert args[:3] == ["pip", "install", "-e"], args
        pip = ["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
        result = run_python([*pip, "--target", str(site), str(root / args[3])], cwd=root)
        assert result.returncode == 0, result.stderr
        return result.stdout
    assert args[0] == "python", args
    if args[1:3] == ["-m", "agentgym.train"]:
        output = root / f"train{index}"
        train_two_steps(args[3:], output=output, model_cache=model_cache, pythonpath=site)
        assert {1, 2} <= set(logged_steps(output))
        return ""
    rest = args[1:]
    if rest[:2] == ["-m", "agentgym.eval"]:
        rest += [f"hydra.run.dir={root / f'eval{index}'}"]
    stdin = TYPED.get(rest[2], ":q\n") if rest[:2] == ["-m", "agentgym.play"] else ""
    result = run_python(rest, cwd=root, pythonpath=site, stdin=stdin)
    assert result.returncode == 0, f"{shlex.join(args)}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_the_docs_show_both_ways_and_constructor_arguments() -> None:
    shown = [shlex.join(c) for c in CONTRIBUTING_COMMANDS + ENVS_PAGE_COMMANDS]
    assert "python -m agentgym.train env=coin generation=hf" in shown  # a plain Gymnasium env
    # a plugin's constructor arguments, set without a '+' (train and eval add them)
    assert any(c.startswith("python -m agentgym.train env=number_line env.kwargs.") for c in shown)
    assert not any("env.name=number_line" in c or "env.name=coin " in c for c in shown)
    assert "class CoinEnv(gymnasium.Env[str, str]):" in CONTRIBUTING


@pytest.mark.slow
def test_every_contributing_command_runs(docs_site: Path, model_cache: Path) -> None:
    outputs = [
        run_command(args, docs_site, model_cache, index)
        for index, args in enumerate(CONTRIBUTING_COMMANDS)
    ]
    assert "'number_line'" in outputs[1]  # list_envs() after the install
    ran = zip(CONTRIBUTING_COMMANDS, outputs, strict=True)
    plays = [out for args, out in ran if "agentgym.play" in args]
    assert any("Walk to the target." in out for out in plays)
    assert any("Guess the side of a hidden coin" in out for out in plays)


@pytest.mark.slow
def test_every_envs_page_command_runs(docs_site: Path, model_cache: Path) -> None:
    for index, args in enumerate(ENVS_PAGE_COMMANDS):
        run_command(args, docs_site, model_cache, 100 + index)


def test_commands_are_found() -> None:
    assert len(CONTRIBUTING_COMMANDS) >= 15 and len(ENVS_PAGE_COMMANDS) == 4
