"""The registry: names, ids, close-match errors and entry-point plugins."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym import registry
from tests.forkserver import run_python
from tests.plugins import WALK

# the LineWalkEnv of tests/plugins.py, plus a class that is not an env
PLUGIN_MODULE = WALK + "\n\nclass NotAnEnv:\n    pass\n"


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution with agentgym.envs entry points, installed by putting it on sys.path."""
    (tmp_path / "agentgym_demo_plugin.py").write_text(PLUGIN_MODULE)
    (tmp_path / "agentgym_broken_plugin.py").write_text("raise ImportError('boom: missing dep')\n")
    dist_info = tmp_path / "agentgym_demo_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: agentgym-demo-plugin\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [agentgym.envs]
            line_walk = agentgym_demo_plugin:LineWalkEnv
            broken_walk = agentgym_broken_plugin:Env
            not_an_env = agentgym_demo_plugin:NotAnEnv
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield dist_info
    monkeypatch.undo()
    for name in ("line_walk", "broken_walk", "not_an_env"):
        if name in registry._SPECS:
            agentgym.unregister(name)
    registry.discover_plugins()


def test_plugin_env_is_made_by_short_name_and_by_id(plugin_dist: Path) -> None:
    env = agentgym.make("line_walk", length=2)
    observation, _ = env.reset(seed=0)
    assert observation == "P__"
    _, reward, terminated, _, info = env.step("<answer>right</answer>")
    _, reward, terminated, _, info = env.step("<answer>Right</answer>")
    assert terminated and reward == 1.0 and info["success"]
    assert "line_walk" in agentgym.list_envs()
    by_id = gymnasium.make("agentgym/LineWalk-v0")
    check_env(by_id.unwrapped)
    assert agentgym.spec("line_walk").plugin is not None


def test_broken_plugin_error_names_the_plugin_and_its_exception(plugin_dist: Path) -> None:
    with pytest.raises(agentgym.PluginError) as excinfo:
        agentgym.make("broken_walk")
    message = str(excinfo.value)
    assert "agentgym-demo-plugin" in message and "broken_walk" in message
    assert "ImportError: boom: missing dep" in message
    assert isinstance(excinfo.value.__cause__, ImportError)
    with pytest.raises(agentgym.PluginError, match=r"gymnasium\.Env subclass"):
        agentgym.make("not_an_env")


def test_plugin_clashing_with_a_builtin_is_reported(plugin_dist: Path) -> None:
    with (plugin_dist / "entry_points.txt").open("a") as f:
        f.write("sokoban = agentgym_demo_plugin:LineWalkEnv\n")
    registry.discover_plugins()
    with pytest.raises(agentgym.PluginError, match="already registered"):
        agentgym.make("sokoban")


def test_misspelled_name_suggests_the_right_one() -> None:
    with pytest.raises(agentgym.UnknownEnvError, match="Did you mean 'sokoban'"):
        agentgym.make("sokobna")
    with pytest.raises(agentgym.UnknownEnvError, match="Did you mean 'frozen_lake'"):
        agentgym.make("FrozenLake")
    with pytest.raises(agentgym.UnknownEnvError, match="'agentgym/Sokoban-v0'"):
        agentgym.make("agentgym/Sokoban-v1")
    with pytest.raises(agentgym.UnknownEnvError, match="Registered envs") as excinfo:
        agentgym.make("nonexistent-xyz")
    assert "Did you mean" not in str(excinfo.value)


def test_builtin_names_and_ids() -> None:
    assert {"sokoban", "frozen_lake"} <= set(agentgym.list_envs())
    assert agentgym.spec("sokoban").id == "agentgym/Sokoban-v0"
    assert agentgym.spec("agentgym/FrozenLake-v0").name == "frozen_lake"
    assert registry.default_id("frozen_lake") == "agentgym/FrozenLake-v0"
    env = agentgym.make("agentgym/Sokoban-v0", dim_room=(7, 7))
    assert len(env.reset(seed=0)[0].split("\n")) == 7


def test_register_validates_and_rejects_clashes() -> None:
    with pytest.raises(ValueError, match="clashes"):
        agentgym.register("sokoban", "agentgym.envs.sokoban:SokobanEnv")
    with pytest.raises(ValueError, match="clashes"):
        agentgym.register("other", "x:Y", id="agentgym/Sokoban-v0")
    with pytest.raises(ValueError, match="Invalid env name"):
        agentgym.register("bad name", "x:Y")
    with pytest.raises(ValueError, match="namespace"):
        agentgym.register("elsewhere", "x:Y", id="other/Thing-v0")
    agentgym.register(
        "frozen_lake_plus", "agentgym.envs.frozen_lake:FrozenLakeEnv", kwargs={"size": 6}
    )
    try:
        observation, _ = agentgym.make("frozen_lake_plus").reset(seed=0)
        assert len(observation.split("\n")) == 6
        assert len(agentgym.make("frozen_lake_plus", size=3).reset(seed=0)[0].split("\n")) == 3
    finally:
        agentgym.unregister("frozen_lake_plus")
    assert "agentgym/FrozenLakePlus-v0" not in gymnasium.registry


def test_misspelled_constructor_argument_lists_the_valid_ones() -> None:
    with pytest.raises(TypeError, match="Did you mean 'num_boxes'") as excinfo:
        agentgym.make("sokoban", num_box=2)
    message = str(excinfo.value)
    assert "'sokoban'" in message
    assert "dim_room" in message and "format_penalty" in message  # own and TextEnv's


def test_hydra_env_group_accepts_a_plugin_name(plugin_dist: Path, tmp_path: Path) -> None:
    """``env=<plugin>`` works with no YAML file: the entry points give a default config."""
    import os

    environment = {**os.environ, "PYTHONPATH": str(plugin_dist.parent)}
    result = run_python(
        ["-m", "agentgym.train", "env=line_walk", "--cfg", "job"], env=environment, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "name: line_walk" in result.stdout
    result = run_python(
        ["-m", "agentgym.train", "env=line_wlk", "--cfg", "job"], env=environment, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "line_walk" in result.stderr  # Hydra lists the available options


def test_env_versions_name_the_full_id_and_the_generator_version(plugin_dist: Path) -> None:
    from agentgym.envs.webshop import GENERATOR_VERSION

    versions = registry.env_versions(["webshop", "sokoban", "line_walk"])
    assert versions["webshop"] == {
        "id": "agentgym/WebShop-v1",
        "generator_version": GENERATOR_VERSION,
        "plugin": None,
    }
    assert GENERATOR_VERSION == 3
    assert versions["sokoban"]["id"] == "agentgym/Sokoban-v0"
    assert versions["sokoban"]["generator_version"] == 1
    assert versions["line_walk"]["id"] == "agentgym/LineWalk-v0"
    assert versions["line_walk"]["generator_version"] is None  # the plugin sets none
    assert "agentgym-demo-plugin" in versions["line_walk"]["plugin"]
    with pytest.raises(agentgym.UnknownEnvError, match="Did you mean 'webshop'"):
        registry.env_versions(["webshp"])


def test_webshop_v0_is_gone_and_points_to_v1() -> None:
    """WebShop's reward rules changed in v1; the short name points to the newest id."""
    assert agentgym.spec("webshop").id == "agentgym/WebShop-v1"
    with pytest.raises(agentgym.UnknownEnvError, match="Did you mean 'agentgym/WebShop-v1'"):
        agentgym.make("agentgym/WebShop-v0")
    with pytest.raises(gymnasium.error.DeprecatedEnv, match="agentgym/WebShop-v1"):
        gymnasium.make("agentgym/WebShop-v0")


def test_gymnasium_ids_outside_agentgym_are_made_by_gymnasium() -> None:
    env = agentgym.make("FrozenLake-v1", is_slippery=False)
    assert agentgym.spec("FrozenLake-v1").id == "FrozenLake-v1"
    assert type(env.unwrapped).__name__ == "FrozenLakeEnv"
    with pytest.raises(agentgym.UnknownEnvError, match="Unknown env 'agentgym/NoSuch-v0'"):
        agentgym.make("agentgym/NoSuch-v0")
