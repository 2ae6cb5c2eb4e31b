"""End-to-end runs of the real entry points: eval (Hydra) and play."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import masked_spans


def run(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, input=stdin, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("env", "agent", "success"), [("sokoban", "solver", 1.0), ("frozen_lake", "solver", 1.0)]
)
def test_eval_solver_succeeds_everywhere(tmp_path: Path, env: str, agent: str, success: float):
    result = run(
        "agentgym.eval", f"env={env}", f"agent={agent}", "episodes=8", f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["metrics"][f"{env}/success"] == success
    assert len(report["episodes"]) == 8
    pages = sorted((tmp_path / "renders").glob("*_seed*.html"))
    assert len(pages) == 4
    assert "reward" in pages[0].read_text()
    assert len(list((tmp_path / "renders").glob("*.gif"))) == 4


def test_eval_random_agent_with_env_overrides(tmp_path: Path) -> None:
    result = run(
        "agentgym.eval", "env=sokoban", "agent=random", "episodes=5", "++env.kwargs.max_steps=7",
        "++env.kwargs.dim_room=[7,7]", "render_save_dir=null", f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    assert all(e["turns"] <= 7 for e in report["episodes"])
    assert not (tmp_path / "renders").exists()


def test_eval_unknown_env_and_agent_fail_clearly(tmp_path: Path) -> None:
    result = run(
        "agentgym.eval", "env=sokoban", "env.name=sokobn", f"hydra.run.dir={tmp_path}", cwd=tmp_path
    )
    assert result.returncode != 0 and "Did you mean 'sokoban'" in result.stderr
    result = run(
        "agentgym.eval", "model.path=/no/such/model", f"hydra.run.dir={tmp_path}", cwd=tmp_path
    )
    assert result.returncode != 0
    assert "is not a model folder" in result.stderr
    result = run("agentgym.eval", "agent=oracle", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode != 0
    assert "Valid options: ['auto', 'model', 'solver', 'random']" in result.stderr


@pytest.mark.parametrize(
    ("env", "model"), [("sokoban", "tiny_model_dir"), ("math_tool", "qwen_model_dir")]
)
def test_eval_tiny_model_writes_renders_and_a_checkable_dump(
    tmp_path: Path, env: str, model: str, request: pytest.FixtureRequest
) -> None:
    model_dir = request.getfixturevalue(model)
    result = run(
        "agentgym.eval", f"env={env}", f"model.path={model_dir}", "generation=hf",
        "episodes=3", "max_turns=3", "generation.max_new_tokens=8", "renders=2",
        "prefix_check=strict", f"hydra.run.dir={tmp_path}",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "on hf" in result.stdout
    if env == "sokoban":  # the tool env has no pictures, only transcripts
        assert len(list((tmp_path / "renders").glob("*.gif"))) == 2
    assert len(list((tmp_path / "renders").glob("*_seed*.html"))) == 2
    assert f"{env}_seed" in (tmp_path / "renders" / "index.html").read_text()
    meta = json.loads((tmp_path / "rollouts" / "meta.json").read_text())
    assert meta["config"]["episodes"] == 3
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(meta["tokenizer"])
    lines = (tmp_path / "rollouts" / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        record = json.loads(line)
        spans = masked_spans(record["input_ids"], record["loss_mask"])
        assert spans == [turn["response_ids"] for turn in record["turns"]]
        responses = [str(tokenizer.decode(t["response_ids"])) for t in record["turns"]]
        assert [tokenizer.decode(span) for span in spans] == responses
        assert len(record["logprobs"]) == len(record["input_ids"])
        assert {"group_id", "tag", "seed", "success", "termination_reason"} <= set(record)
        assert record["prefix_drift"] is None
        assert bool(record["tools"]) == (env == "math_tool")


def test_play_solves_a_room_from_typed_actions(tmp_path: Path) -> None:
    import agentgym

    env = agentgym.make("sokoban")
    env.reset(seed=3)
    plan = env.unwrapped.solve()  # type: ignore[attr-defined]
    typed = "\n".join(["jump", "", ":hint", *(a.lower() for a in plan), ":q"]) + "\n"
    result = run("agentgym.play", "sokoban", "--seed", "3", cwd=tmp_path, stdin=typed)
    assert result.returncode == 0, result.stderr
    assert "Push every box onto a target" in result.stdout
    assert "invalid: unknown action 'jump'" in result.stdout
    assert f"plan: {plan}" in result.stdout
    assert "episode over: solved" in result.stdout
    assert "[seed 4]" in result.stdout


def test_play_reports_bad_arguments(tmp_path: Path) -> None:
    result = run("agentgym.play", "frozen_lak", cwd=tmp_path)
    assert result.returncode == 2 and "Did you mean 'frozen_lake'" in result.stderr
    result = run("agentgym.play", "frozen_lake", "--set", "size", cwd=tmp_path)
    assert result.returncode == 2 and "key=value" in result.stderr
    result = run("agentgym.play", "frozen_lake", "--set", "size=6", cwd=tmp_path, stdin=":q\n")
    assert result.returncode == 0
    grid = result.stdout.split("[seed 0]\n")[1].split("\naction>")[0].split("\n")
    assert len(grid) == 6 and all(len(row) == 6 for row in grid) and grid[0][0] == "P"


def test_play_passes_tool_calls_through_and_hints_with_the_oracle(tmp_path: Path) -> None:
    from agentgym.play import to_response

    env = agentgym_make_text("math_tool")
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>'
    assert to_response(call, env) == call
    assert to_response("Up", env) == "<answer>Up</answer>"
    result = run("agentgym.play", "math_tool", "--seed", "2", cwd=tmp_path, stdin=":hint\n:q\n")
    assert result.returncode == 0, result.stderr
    assert "expert: <tool_call>" in result.stdout


def agentgym_make_text(name: str) -> Any:
    import agentgym

    return agentgym.make(name).unwrapped


def test_play_does_not_import_torch(tmp_path: Path) -> None:
    script = (
        "import runpy, sys\n"
        "sys.argv = ['play', 'sokoban', '--seed', '3']\n"
        "try:\n    runpy.run_module('agentgym.play', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\n"
        "print('heavy:', heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], input=":q\n", capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout


def test_eval_says_why_when_every_episode_failed(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = run(
        "agentgym.eval", "env=sokoban", f"model.path={tiny_model_dir}", "generation=openai",
        f"generation.base_url={url}", "episodes=2", f"hydra.run.dir={tmp_path}", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    assert "every episode failed; 2 episode(s) ended with generation_error" in result.stderr
    assert f"POST {url}/v1/completions failed" in result.stderr
