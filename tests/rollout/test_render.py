"""Renders: file names, the index (steps in numeric order, pass/fail), which episodes to render."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from agentgym.rollout.render import (
    RenderName,
    pick_renders,
    render_trajectories,
    trajectory_name,
    transcript_html,
)
from agentgym.trajectory import Trajectory, Turn


def episode(
    tag: str = "sokoban", group_id: int = 0, success: bool = False, score: float = -0.4
) -> Trajectory:
    turn = Turn(
        prompt_ids=[1, 2],
        response_ids=[3],
        logprobs=[-0.1],
        response_text="<answer>Up</answer>",
        finish_reason="stop",
        reward=score,
        actions=["Up"],
        observation="#P_#",
    )
    frame = np.full((8, 8, 3), 200, dtype=np.uint8)
    return Trajectory(
        env_name=tag,
        tag=tag,
        group_id=group_id,
        seed=1000 + group_id,
        turns=[turn],
        score=score,
        success=success,
        termination_reason="success" if success else "max_turns",
        frames=[frame, frame],
    )


def test_the_file_name_says_step_tag_seed_group_score_and_pass_or_fail() -> None:
    assert trajectory_name(episode("frozen_lake", 7, True, 1.0), step=3) == (
        "step3_frozen_lake_seed1007_g7_score1.00_pass"
    )
    assert trajectory_name(episode()) == "sokoban_seed1000_g0_score-0.40_fail"
    assert RenderName.parse("step3_frozen_lake_seed1007_g7_score1.00_pass") == RenderName(
        "step3_frozen_lake_seed1007_g7_score1.00_pass", 3, "frozen_lake", 1007, 7, "1.00", True
    )
    # a name from before the pass/fail mark
    assert RenderName.parse("step10_sokoban_seed5_g1_score-0.40") == RenderName(
        "step10_sokoban_seed5_g1_score-0.40", 10, "sokoban", 5, 1, "-0.40", None
    )
    assert RenderName.parse("index") is None


@given(
    tag=st.from_regex(r"[a-z][a-z0-9_\-]{0,20}", fullmatch=True),
    group_id=st.integers(0, 10_000),
    seed=st.integers(-(2**31), 2**31),
    score=st.floats(-1e6, 1e6),
    success=st.booleans(),
    step=st.none() | st.integers(0, 10**6),
)
def test_a_file_name_parses_back_into_its_parts(
    tag: str, group_id: int, seed: int, score: float, success: bool, step: int | None
) -> None:
    trajectory = episode(tag, group_id, success, score)
    trajectory.seed = seed
    name = RenderName.parse(trajectory_name(trajectory, step))
    assert name is not None
    assert (name.step, name.tag, name.seed, name.group_id, name.success) == (
        step,
        tag,
        seed,
        group_id,
        success,
    )
    assert name.score == f"{score:.2f}"


def sections(index: str) -> list[tuple[str, list[str]]]:
    """(heading, [card text, ...]) per step section of the index, in page order."""
    found = []
    for heading, body in re.findall(r"<h2 id=\w+>(.*?)</h2><div class=grid>(.*?)</div>", index):
        cards = re.findall(r"<a class=card [^>]*>(?:<img [^>]*><br>)?(.*?)</a>", body)
        text = [re.sub(r"<[^>]+>", "", card.replace("<br>", " · ")) for card in cards]
        found.append((heading, text))
    return found


def test_the_index_groups_by_step_in_numeric_order_and_marks_pass_and_fail(
    tmp_path: Path,
) -> None:
    (tmp_path / "step5_sokoban_seed9_g0_score0.00.html").write_text("an older render")
    for step in (10, 2, 0):
        render_trajectories(
            [episode(group_id=1, success=step >= 2, score=1.0), episode(group_id=0)],
            tmp_path,
            step=step,
        )
    render_trajectories([episode("frozen_lake", 0, True, 1.0)], tmp_path)  # eval: no step

    index = (tmp_path / "index.html").read_text()
    render_trajectories([], tmp_path)  # rebuilt from the folder: the same
    assert (tmp_path / "index.html").read_text() == index

    assert sections(index) == [
        (
            "Step 0 · 0 of 2 passed",
            [
                "✗ fail sokoban · seed 1000 · score -0.40",
                "✗ fail sokoban · seed 1001 · score 1.00",
            ],
        ),
        (
            "Step 2 · 1 of 2 passed",
            [
                "✗ fail sokoban · seed 1000 · score -0.40",
                "✓ pass sokoban · seed 1001 · score 1.00",
            ],
        ),
        ("Step 5 · 1 episodes", ["? sokoban · seed 9 · score 0.00"]),
        (
            "Step 10 · 1 of 2 passed",
            [
                "✗ fail sokoban · seed 1000 · score -0.40",
                "✓ pass sokoban · seed 1001 · score 1.00",
            ],
        ),
        ("Renders · 1 of 1 passed", ["✓ pass frozen_lake · seed 1000 · score 1.00"]),
    ]
    assert "<h1>Trajectories (8)</h1>" in index
    assert 'href="step10_sokoban_seed1001_g1_score1.00_pass.html">' in index
    assert '<img src="step10_sokoban_seed1001_g1_score1.00_pass.gif"' in index
    assert '<a href="#step2">Step 2</a>: 1 of 2 passed' in index


def test_the_transcript_marks_pass_or_fail() -> None:
    assert "<span class='mark pass'>✓ pass</span> sokoban" in transcript_html(episode(success=True))
    assert "<span class='mark fail'>✗ fail</span> sokoban" in transcript_html(episode())


def test_a_steps_index_shows_its_whole_validations_success_beside_the_shown_episodes(
    tmp_path: Path,
) -> None:
    played = [episode(group_id=i, success=i < 3, score=1.0 if i < 3 else 0.0) for i in range(8)]
    played.append(replace(episode(group_id=9), termination_reason="env_error"))  # not counted
    render_trajectories(pick_renders(played, 2), tmp_path, step=4, played=played)
    index = (tmp_path / "index.html").read_text()
    assert [title for title, _ in sections(index)] == [
        "Step 4 · validation 37.5% of 8 · shown: 2 of 2 passed"
    ]


def test_a_transcript_tells_valid_from_moved_and_ends_on_the_final_observation() -> None:
    moved = replace(episode().turns[0], action_is_effective=True)
    wall = replace(moved, action_is_effective=False, reward=-0.1)
    garbled = replace(moved, action_is_valid=False, actions=[])
    played = replace(
        episode(score=0.8),
        turns=[moved, wall, garbled],
        final_observation="#_P#",
        termination_reason="max_turns",
    )
    page = transcript_html(played)
    assert re.findall(r"</b> · (.*?) · reward", page) == [
        "valid · moved",
        "valid · did not move",
        "INVALID",
    ]
    end = page[page.index("<h3>End</h3>") :]
    assert "<pre class=obs>#_P#</pre>" in end
    assert "final reward -0.400 · score 0.800 · not solved · ended by max_turns" in end


def test_pick_renders_takes_some_of_every_tag() -> None:
    trajectories = [
        episode("sokoban", 0),
        episode("sokoban", 1),
        episode("frozen_lake", 2),
        episode("sokoban", 3),
        episode("frozen_lake", 4),
        episode("frozen_lake", 5),
        episode("webshop", 6),
    ]
    picked = pick_renders(trajectories, per_tag=2)
    assert [(t.tag, t.group_id) for t in picked] == [
        ("sokoban", 0),
        ("sokoban", 1),
        ("frozen_lake", 2),
        ("frozen_lake", 4),
        ("webshop", 6),
    ]
    assert pick_renders(trajectories, per_tag=0) == []
    assert pick_renders([], per_tag=3) == []


def test_a_namespaced_tag_makes_a_flat_file_name(tmp_path: Path) -> None:
    from agentgym.rollout.render import trajectory_name

    trajectory = Trajectory("ns/Coin-v0", "ns/Coin-v0", group_id=1, seed=5)
    name = trajectory_name(trajectory, step=2)
    assert name == "step2_ns-Coin-v0_seed5_g1_score0.00_fail"
    (tmp_path / f"{name}.html").write_text("ok")  # one file, no folder
