"""The wheel holds agentgym and nothing else; bare folder imports are refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINKED = ("envs", "rollout", "trainers", "configs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """Build a wheel from a copy of the source tree (symlinks kept as symlinks)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    ignore = shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "outputs"
    )
    shutil.copytree(REPO, source, symlinks=True, ignore=ignore)
    out = tmp / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
         "-w", str(out), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    # the project's metadata is current (a SPDX license string, license-files)
    assert "Deprecation" not in built.stdout + built.stderr, built.stdout[-3000:]
    (path,) = out.glob("agentgym-*.whl")
    return zipfile.ZipFile(path)


def test_symlinks_point_at_the_top_level_folders() -> None:
    for name in LINKED:
        link = REPO / "agentgym" / name
        assert link.is_symlink() and link.readlink() == Path("..") / name


def test_wheel_contains_every_subpackage_and_no_other_top_level(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"agentgym"}
    source_packages = {
        "agentgym/" + str(init.parent.relative_to(REPO)).replace("\\", "/") + "/__init__.py"
        for folder in LINKED
        for init in (REPO / folder).rglob("__init__.py")
    }
    assert source_packages <= set(names)
    for required in [
        "agentgym/py.typed",
        "agentgym/registry.py",
        "agentgym/envs/sokoban/solver.py",
        "agentgym/configs/eval.yaml",
        "agentgym/configs/env/sokoban.yaml",
        "agentgym/configs/train/agent/proxy.yaml",
        "agentgym/envs/webshop/vocab.json",
    ]:
        assert required in names
    entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "agentgym = agentgym.cli:main" in entry_points and "agentgym-play" not in entry_points
    metadata = wheel.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith("licenses/LICENSE") for n in names)


@pytest.mark.parametrize("name", LINKED)
def test_bare_import_is_refused(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert f"must be imported as 'agentgym.{name}'" in result.stderr
