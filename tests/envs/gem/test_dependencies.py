"""The ``gem`` extra's install (make setup: the extra, then gem-llm with --no-deps) keeps
hydra-core's antlr4 4.9 runtime and grades GEM's math in the same process."""

from __future__ import annotations

from importlib.metadata import requires, version
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

pytest.importorskip("gem")  # make setup installs it; a bare checkout may not have it

CONFIGS = Path(__file__).parents[3] / "configs"


def test_hydra_composes_and_gems_math_grader_grades_in_one_process() -> None:
    from gem.envs.math_env import MathEnv
    from gem.utils.math_grader import boxed_reward_fn

    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["env=sokoban", "max_steps=3"])
    assert (cfg.env.name, cfg.max_steps) == ("sokoban", 3)
    assert version("antlr4-python3-runtime").startswith("4.9.")  # hydra-core's grammar
    # GEM's own grading path (math_verify's LaTeX parser on the 4.9.3 runtime)
    assert boxed_reward_fn(r"so \boxed{\frac{1}{2}}", "0.5", fast=False)[1] == 1.0
    assert boxed_reward_fn(r"so \boxed{\frac{1}{3}}", "0.5", fast=False)[1] == 0.0
    assert MathEnv.check_correct(r"\boxed{\frac{1}{2}}", "0.5")
    assert not MathEnv.check_correct(r"\boxed{\sqrt{2}}", "0.5")


def test_math_verify_parses_latex_on_the_49_runtime() -> None:
    from math_verify import parse, verify  # type: ignore[import-untyped]

    half = parse(r"$\frac{1}{2}$")
    assert verify(parse("0.5"), half)
    assert not verify(parse("0.25"), half)
    # gem-llm names the 4.13.2 parser; what the extra installs in its place is 4.9.3
    assert any("antlr4_13_2" in line for line in requires("gem-llm") or [])
