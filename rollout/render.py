"""Render trajectories to ``render_save_dir`` and dump them to ``rollout_dump_dir``.

Renders: an animated GIF of the env's frames (where the env draws pictures)
and an HTML transcript per trajectory, named with env tag, seed and score, and
an ``index.html`` listing every render of the folder. Dumps: JSONL, one
trajectory per line, with a ``meta.json`` beside it that records the resolved
config and the tokenizer's path, so that anyone can decode and re-check them.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.trajectory import Trajectory


def trajectory_name(trajectory: Trajectory, step: int | None = None) -> str:
    """A file stem such as ``step3_sokoban_seed42_g7_score10.30``."""
    prefix = f"step{step}_" if step is not None else ""
    return (
        f"{prefix}{trajectory.tag}_seed{trajectory.seed}_g{trajectory.group_id}"
        f"_score{trajectory.score:.2f}"
    )


def save_gif(frames: Sequence[Any], path: Path, fps: float = 2.0) -> None:
    """Write RGB frames (``[H, W, 3]`` uint8) as an animated GIF that loops forever."""
    from PIL import Image

    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in frames]
    images[0].save(
        path,
        save_all=True,
        append_images=images[1:],
        duration=max(int(1000 / fps), 20),
        loop=0,
    )


def transcript_html(trajectory: Trajectory) -> str:
    """A readable page: each turn's observation, the model's text, the parsed action,
    validity and reward."""
    rows = []
    for index, turn in enumerate(trajectory.turns):
        valid = "valid" if turn.action_is_valid else "INVALID"
        actions = ", ".join(turn.actions) or "-"
        rows.append(
            f"<h3>Turn {index + 1}</h3>"
            f"<pre class=obs>{html.escape(turn.observation)}</pre>"
            f"<pre class=model>{html.escape(turn.response_text)}</pre>"
            f"<p>actions: <b>{html.escape(actions)}</b> · {valid} · reward {turn.reward:+.3f}"
            f" · {len(turn.response_ids)} tokens ({turn.finish_reason})</p>"
        )
    system = trajectory.messages[0]["content"] if trajectory.messages else ""
    error = f"<pre class=error>{html.escape(trajectory.error)}</pre>" if trajectory.error else ""
    return (
        "<!doctype html><meta charset=utf-8>"
        f"<title>{html.escape(trajectory_name(trajectory))}</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "pre{padding:6px;white-space:pre-wrap}.obs{background:#eef}.model{background:#efe}"
        ".error{background:#fee}</style>"
        f"<h1>{html.escape(trajectory.tag)} · seed {trajectory.seed}</h1>"
        f"<p>score {trajectory.score:.3f} · success {trajectory.success} · "
        f"{len(trajectory.turns)} turns · ended by {trajectory.termination_reason}</p>"
        f"<details><summary>system prompt</summary><pre>{html.escape(system)}</pre></details>"
        + "".join(rows)
        + error
    )


def render_trajectories(
    trajectories: Sequence[Trajectory], directory: str | Path, step: int | None = None
) -> list[Path]:
    """Write a GIF (when the trajectory has frames) and an HTML transcript for each
    trajectory, then rebuild the folder's ``index.html``.

    Returns:
        The files written, index included.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for trajectory in trajectories:
        stem = trajectory_name(trajectory, step)
        if trajectory.frames:
            save_gif(trajectory.frames, directory / f"{stem}.gif")
            written.append(directory / f"{stem}.gif")
        page = directory / f"{stem}.html"
        page.write_text(transcript_html(trajectory), encoding="utf-8")
        written.append(page)
    written.append(write_index(directory))
    return written


def write_index(directory: Path) -> Path:
    """List every transcript of ``directory`` (with its GIF, if any) in ``index.html``."""
    items = []
    for page in sorted(directory.glob("*.html")):
        if page.name == "index.html":
            continue
        gif = page.with_suffix(".gif")
        picture = f'<br><img src="{html.escape(gif.name)}" height=120>' if gif.exists() else ""
        items.append(
            f'<li><a href="{html.escape(page.name)}">{html.escape(page.stem)}</a>{picture}'
        )
    index = directory / "index.html"
    index.write_text(
        "<!doctype html><meta charset=utf-8><title>agentgym renders</title>"
        f"<h1>Trajectories ({len(items)})</h1><ul>{''.join(items)}</ul>",
        encoding="utf-8",
    )
    return index


def trajectory_record(trajectory: Trajectory) -> dict[str, Any]:
    """One JSONL line: everything needed to decode and re-check a trajectory."""
    logprobs = [
        lp for turn in trajectory.turns for lp in [0.0] * len(turn.prompt_ids) + turn.logprobs
    ]
    return {
        "env": trajectory.env_name,
        "tag": trajectory.tag,
        "group_id": trajectory.group_id,
        "seed": trajectory.seed,
        "mode": trajectory.mode,
        "messages": trajectory.messages,
        "tools": trajectory.tools,
        "input_ids": trajectory.input_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": logprobs,
        "turns": [
            {
                "prompt_ids": turn.prompt_ids,
                "response_ids": turn.response_ids,
                "reward": turn.reward,
                "action_is_valid": turn.action_is_valid,
                "actions": turn.actions,
                "finish_reason": turn.finish_reason,
            }
            for turn in trajectory.turns
        ],
        "rewards": [turn.reward for turn in trajectory.turns],
        "score": trajectory.score,
        "success": trajectory.success,
        "termination_reason": trajectory.termination_reason,
        "error": trajectory.error,
        "prefix_drift": trajectory.prefix_drift,
        "policy_version": trajectory.policy_version,
    }


def dump_trajectories(
    trajectories: Sequence[Trajectory],
    directory: str | Path,
    *,
    name: str = "rollouts",
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Append ``trajectories`` to ``directory/{name}.jsonl`` and write ``meta.json``.

    Args:
        trajectories: Finished trajectories.
        directory: The dump folder.
        name: File stem (e.g. ``"step_10"``).
        meta: Resolved config, tokenizer path, and anything else a reader needs.

    Returns:
        The JSONL path.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if meta is not None:
        temporary = directory / "meta.json.tmp"
        temporary.write_text(json.dumps(dict(meta), indent=2, default=str), encoding="utf-8")
        os.replace(temporary, directory / "meta.json")
    path = directory / f"{name}.jsonl"
    with path.open("a", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory_record(trajectory)) + "\n")
    return path
