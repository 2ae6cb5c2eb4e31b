"""Every ``key=value`` the docs show is a key agentgym has: the commands of README.md,
docs/ and CONTRIBUTING.md (every code block, not only the ones that run) and the
overrides written inline, checked against the schema, the config groups and the
commands, without running anything. A renamed key or a missing group option fails
here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import agentgym
from agentgym.cli import COMMANDS
from agentgym.command_line import OPEN_PREFIXES
from agentgym.errors import did_you_mean
from agentgym.formats.native import CONFIG_GROUPS
from agentgym.schema import known_paths

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = ROOT / "agentgym" / "configs"
RUNS = re.compile(r"(?:python -m agentgym\.(train|eval)|\bagentgym (train|eval|bench))\b(.*)")
INLINE = re.compile(r"`([+~]?[a-z_][\w.]*=[^`\s]*)`")
OVERRIDE = re.compile(r"^[+~]*([a-z_][\w.]*)=")


def eval_keys() -> set[str]:
    """The keys of ``agentgym eval``'s composed config (``configs/eval.yaml`` and its
    groups), as paths."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("agentgym.configs", version_base=None):
        composed = OmegaConf.to_container(compose("eval"), resolve=False)
    paths: set[str] = set()

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                paths.add(f"{prefix}{key}")
                walk(value, f"{prefix}{key}.")

    walk(composed, "")
    return paths


TRAIN_KEYS = set(known_paths())
EVAL_KEYS = eval_keys()


DOCS_PLUGIN_ENVS = {"coin", "number_line"}
"""Envs the docs write as plugins of your own (tests/envs/test_docs.py builds them)."""
DELIBERATE = {"max_step=10", "buffer.batch_size=8"}
"""Inline examples that are not agentgym's keys on purpose: a typo and what it gets
(training.md), Trinity-RFT's key on one of its files (coming_from.md)."""


def group_options(group: str) -> set[str]:
    folder = CONFIGS / ("train/agent" if group == "agent" else group)
    options = {p.stem for p in folder.glob("*.yaml")}
    return options | set(agentgym.list_envs()) | DOCS_PLUGIN_ENVS if group == "env" else options


def problem(override: str, command: str) -> str | None:
    """What is wrong with ``override`` in a ``command`` run (None: nothing)."""
    match = OVERRIDE.match(override)
    if match is None or "${" in override:
        return None
    key, value = match.group(1), override.split("=", 1)[1].strip("'\"")
    keys = EVAL_KEYS if command == "eval" else TRAIN_KEYS
    if key in CONFIG_GROUPS and not (command == "eval" and key == "agent"):
        if value and not re.fullmatch(r"[A-Z<]+.*|.*[<>].*", value):  # DIR, <name>: a slot
            options = group_options(key)
            if value not in options and ":" not in value:
                return f"{key}={value}: no option {value!r} (options: {sorted(options)})"
        return None
    if key in keys or key.startswith((*OPEN_PREFIXES, "hydra.")):
        return None
    return f"unknown key {key!r}{did_you_mean(key, keys)}"


def looks_like_a_key(override: str) -> bool:
    """Whether an inline ``name=value`` is meant as a config key (a dotted path under a
    known section, or a close miss of a known key), not, say, a Python keyword."""
    match = OVERRIDE.match(override)
    if match is None or override in DELIBERATE:
        return False
    key = match.group(1)
    known = TRAIN_KEYS | EVAL_KEYS
    if "." not in key:  # a bare name is a key only when it is one (else: a Python argument)
        return key in known or key in CONFIG_GROUPS
    top = key.split(".")[0]
    return top in known or top in CONFIG_GROUPS


def documented(pages: list[Path]) -> Iterator[tuple[str, str, str]]:
    """(page, command, override) for each override ``pages`` show."""
    for page in pages:
        text = page.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line)
                found = RUNS.search(line)
                if found is None or "--config" in line:  # a file's keys are the file's
                    continue
                command = found.group(1) or found.group(2)
                command = "train" if command == "bench" else command
                try:
                    words = shlex.split(found.group(3))
                except ValueError:
                    words = found.group(3).split()
                for word in words:
                    if "=" in word and not word.startswith("-"):
                        yield page.name, command, word
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for override in INLINE.findall(prose):
            if looks_like_a_key(override):  # a train key, or else an eval one
                command = "eval" if problem(override, "train") else "train"
                yield page.name, command, override


CASES = sorted(set(documented(PAGES)))


def test_the_pages_show_commands_to_check() -> None:
    assert len(CASES) > 100 and {"README.md", "training.md", "agents.md"} <= {c[0] for c in CASES}
    assert set(COMMANDS) >= {"train", "eval", "bench"}


@pytest.mark.parametrize(("page", "command", "override"), CASES)
def test_every_documented_override_names_a_real_key(page: str, command: str, override: str) -> None:
    assert problem(override, command) is None, f"{page}: {override}: {problem(override, command)}"


@pytest.mark.parametrize(
    "override", ["generation.max_new_tokenz=64", "env=sokobn", "trackr=wandb", "agent=proxi"]
)
def test_a_wrong_key_or_option_in_a_page_is_caught(tmp_path: Path, override: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f"Run it:\n\n```bash\npython -m agentgym.train env=sokoban {override}\n```\n\n"
        f"or `agentgym train max_steps=5 {override}`, or set `{override}`.\n"
    )
    found = [(command, o) for _, command, o in documented([page]) if o == override]
    assert any(problem(o, command) is not None for command, o in found)  # the page fails
