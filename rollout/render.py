"""Render trajectories to ``render_save_dir`` and dump them to ``rollout_dump_dir``.

Renders: an animated GIF of the env's frames (where the env draws pictures)
and an HTML transcript per trajectory, named with step, env tag, seed, score
and pass/fail, and an ``index.html`` of every render of the folder, grouped by
step in numeric order with pass/fail marked. :func:`pick_renders` chooses
which validation episodes to render: some of every env tag. Dumps: JSONL, one
trajectory per line, with a ``meta.json`` beside it that records the resolved
config and the tokenizer's path, so that anyone can decode and re-check them.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.fileio import write_json_atomic
from agentgym.trajectory import Trajectory, Turn


def trajectory_name(trajectory: Trajectory, step: int | None = None) -> str:
    """A file stem such as ``step3_sokoban_seed42_g7_score10.30_pass`` (a tag's
    path separators, as in a Gymnasium id ``ns/Env-v0``, become ``-``)."""
    prefix = f"step{step}_" if step is not None else ""
    result = "pass" if trajectory.success else "fail"
    tag = re.sub(r"[/\\:]", "-", trajectory.tag)
    return (
        f"{prefix}{tag}_seed{trajectory.seed}_g{trajectory.group_id}"
        f"_score{trajectory.score:.2f}_{result}"
    )


_NAME = re.compile(
    r"^(?:step(?P<step>\d+)_)?(?P<tag>.+)_seed(?P<seed>-?\d+)_g(?P<group>\d+)"
    r"_score(?P<score>[^_]+?)(?:_(?P<result>pass|fail))?$"
)


@dataclass(frozen=True)
class RenderName:
    """What a render's file name says (see :func:`trajectory_name`).

    Attributes:
        stem: The file name without its suffix.
        step: The training step; None for renders made outside training (eval).
        tag: The env tag.
        seed: The episode's seed.
        group_id: The episode's group.
        score: The score as written (two decimals).
        success: Whether the episode passed; None for names from before the mark.
    """

    stem: str
    step: int | None
    tag: str
    seed: int
    group_id: int
    score: str
    success: bool | None

    @classmethod
    def parse(cls, stem: str) -> RenderName | None:
        """The parts of ``stem``, or None when it is not a render's name."""
        match = _NAME.match(stem)
        if match is None:
            return None
        result = match["result"]
        return cls(
            stem=stem,
            step=int(match["step"]) if match["step"] is not None else None,
            tag=match["tag"],
            seed=int(match["seed"]),
            group_id=int(match["group"]),
            score=match["score"],
            success=None if result is None else result == "pass",
        )


def pick_renders(trajectories: Sequence[Trajectory], per_tag: int) -> list[Trajectory]:
    """The first ``per_tag`` trajectories of every env tag, tag by tag in order of
    first appearance.

    The first, not a sample: validation seeds are fixed, so each validation
    renders the same episodes and a person can compare them across steps.

    Args:
        trajectories: Validation trajectories, of one or several tags.
        per_tag: How many to render per tag (0: none).

    Returns:
        Up to ``per_tag`` × number of tags trajectories.
    """
    by_tag: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        picked = by_tag.setdefault(trajectory.tag, [])
        if len(picked) < per_tag:
            picked.append(trajectory)
    return [trajectory for picked in by_tag.values() for trajectory in picked]


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
    whether it parsed (valid) and changed the state (moved), its reward; then the
    observation the episode ended on with the final reward."""
    rows = []
    for index, turn in enumerate(trajectory.turns):
        actions = ", ".join(turn.actions) or "-"
        rows.append(
            f"<h3>Turn {index + 1}</h3>"
            f"<pre class=obs>{html.escape(turn.observation)}</pre>"
            f"<pre class=model>{html.escape(turn.response_text)}</pre>"
            f"<p>actions: <b>{html.escape(actions)}</b> · {_validity(turn)} · reward "
            f"{turn.reward:+.3f} · {len(turn.response_ids)} tokens ({turn.finish_reason})</p>"
        )
    if trajectory.turns and trajectory.final_observation:
        last = trajectory.turns[-1]
        rows.append(
            "<h3>End</h3>"
            f"<pre class=obs>{html.escape(trajectory.final_observation)}</pre>"
            f"<p>final reward {last.reward:+.3f} · score {trajectory.score:.3f} · "
            f"{'solved' if trajectory.success else 'not solved'} · "
            f"ended by {trajectory.termination_reason}</p>"
        )
    system = trajectory.messages[0]["content"] if trajectory.messages else ""
    error = f"<pre class=error>{html.escape(trajectory.error)}</pre>" if trajectory.error else ""
    return (
        "<!doctype html><meta charset=utf-8>"
        f"<title>{html.escape(trajectory_name(trajectory))}</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:auto}"
        "pre{padding:6px;white-space:pre-wrap}.obs{background:#eef}.model{background:#efe}"
        f".error{{background:#fee}}{_MARK_STYLE}</style>"
        '<p><a href="index.html">← all renders</a></p>'
        f"<h1>{_mark(trajectory.success)} {html.escape(trajectory.tag)} · "
        f"seed {trajectory.seed}</h1>"
        f"<p>score {trajectory.score:.3f} · "
        f"{len(trajectory.turns)} turns · ended by {trajectory.termination_reason}</p>"
        f"<details><summary>system prompt</summary><pre>{html.escape(system)}</pre></details>"
        + "".join(rows)
        + error
    )


def _validity(turn: Turn) -> str:
    """``valid · moved``, ``valid · did not move`` (a move into a wall), ``INVALID``
    (did not parse), or ``valid`` alone when the env does not say whether it moved."""
    if not turn.action_is_valid:
        return "INVALID"
    if turn.action_is_effective is None:
        return "valid"
    return "valid · moved" if turn.action_is_effective else "valid · did not move"


def render_trajectories(
    trajectories: Sequence[Trajectory],
    directory: str | Path,
    step: int | None = None,
    *,
    played: Sequence[Trajectory] = (),
) -> list[Path]:
    """Write a GIF (when the trajectory has frames) and an HTML transcript for each
    trajectory, then rebuild the folder's ``index.html``.

    Args:
        trajectories: The episodes to render.
        directory: The renders' folder.
        step: The training step they were played at (None: not a run's validation).
        played: All the episodes they were picked from (a validation's): the index
            shows their success rate beside the rendered ones' (their passes and
            episodes kept in ``validation_step<step>.json``).

    Returns:
        The files written, index included.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if played and step is not None:
        finished = [t for t in played if not t.failed]
        summary = directory / f"{VALIDATION_PREFIX}{step}.json"
        summary.write_text(
            json.dumps({"episodes": len(finished), "passed": sum(t.success for t in finished)}),
            encoding="utf-8",
        )
        written.append(summary)
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


VALIDATION_PREFIX = "validation_step"
"""``<renders>/validation_step<N>.json``: a step's validation episodes and passes."""


_MARK_STYLE = (
    ".mark{padding:1px 6px;border-radius:4px;color:white;font-size:80%}"
    ".pass{background:#2a7d2a}.fail{background:#b3261e}.unknown{background:#888}"
)


def _mark(success: bool | None) -> str:
    """A pass/fail badge, with a sign as well as a colour."""
    if success is None:
        return "<span class='mark unknown'>?</span>"
    return (
        "<span class='mark pass'>✓ pass</span>"
        if success
        else "<span class='mark fail'>✗ fail</span>"
    )


def _card(directory: Path, name: RenderName) -> str:
    gif = directory / f"{name.stem}.gif"
    picture = f'<img src="{html.escape(gif.name)}" height=120><br>' if gif.exists() else ""
    return (
        f'<a class=card href="{html.escape(name.stem)}.html">{picture}'
        f"{_mark(name.success)} {html.escape(name.tag)}<br>"
        f"seed {name.seed} · score {html.escape(name.score)}</a>"
    )


def _passed(names: Sequence[RenderName], directory: Path, step: int | None) -> str:
    """The rendered episodes' passes, after the whole validation's success rate when
    it was kept (``validation 37.5% of 64 · shown: 2 of 4 passed``)."""
    known = [name.success for name in names if name.success is not None]
    shown = f"{sum(known)} of {len(known)} passed" if known else f"{len(names)} episodes"
    summary = directory / f"{VALIDATION_PREFIX}{step}.json"
    if step is None or not summary.is_file():
        return shown
    validation = json.loads(summary.read_text(encoding="utf-8"))
    episodes, passed = int(validation["episodes"]), int(validation["passed"])
    rate = f"{passed / episodes:.1%}" if episodes else "-"
    return f"validation {rate} of {episodes} · shown: {shown}"


def write_index(directory: Path) -> Path:
    """Write ``index.html``: every transcript of ``directory`` (with its GIF, if
    any), grouped by training step in numeric order (step 5 before step 10),
    each marked pass or fail, with the pass count of each step at the top (after the
    step's whole validation success rate, when :func:`render_trajectories` kept it).

    Returns:
        The index's path.
    """
    groups: dict[int | None, list[RenderName]] = {}
    for page in directory.glob("*.html"):
        name = RenderName.parse(page.stem)
        if name is not None:
            groups.setdefault(name.step, []).append(name)
    order = sorted(groups, key=lambda step: (step is None, step or 0))
    sections, links = [], []
    for step in order:
        names = sorted(groups[step], key=lambda n: (n.tag, n.group_id, n.seed))
        title = "Renders" if step is None else f"Step {step}"
        anchor = "renders" if step is None else f"step{step}"
        passed = _passed(names, directory, step)
        links.append(f'<a href="#{anchor}">{title}</a>: {passed}')
        cards = "".join(_card(directory, name) for name in names)
        sections.append(f"<h2 id={anchor}>{title} · {passed}</h2><div class=grid>{cards}</div>")
    total = sum(len(names) for names in groups.values())
    index = directory / "index.html"
    index.write_text(
        "<!doctype html><meta charset=utf-8><title>agentgym renders</title>"
        "<style>body{font-family:sans-serif;margin:1em 2em}"
        ".grid{display:flex;flex-wrap:wrap;gap:10px}"
        ".card{display:block;border:1px solid #ccc;border-radius:6px;padding:6px;"
        f"color:inherit;text-decoration:none;font-size:90%}}{_MARK_STYLE}</style>"
        f"<h1>Trajectories ({total})</h1><ul><li>{'<li>'.join(links)}</ul>" + "".join(sections),
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
                "action_is_effective": turn.action_is_effective,
                "actions": turn.actions,
                "finish_reason": turn.finish_reason,
            }
            for turn in trajectory.turns
        ],
        "rewards": [turn.reward for turn in trajectory.turns],
        "score": trajectory.score,
        "success": trajectory.success,
        "termination_reason": trajectory.termination_reason,
        "final_observation": trajectory.final_observation,
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
        write_json_atomic(directory / "meta.json", dict(meta), default=str)
    path = directory / f"{name}.jsonl"
    with path.open("a", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory_record(trajectory)) + "\n")
    return path
