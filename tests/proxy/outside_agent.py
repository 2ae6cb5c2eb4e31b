"""An agent someone else starts against a serving explorer (``mode=serve``): it reads
the explorer's address file, opens one session per episode (``group_size`` sessions per
Sokoban room, two rooms at a time), plays each room with the plain ``openai`` client and
posts its reward, until the job finishes. Each session whose reward was taken is a line
of ``OUT`` (JSONL).

Usage: ``python outside_agent.py ADDRESS_FILE OUT GROUP_SIZE MAX_TURNS``
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import openai

import agentgym


class JobFinishedError(Exception):
    """The serving explorer takes no more sessions."""


def play(server: dict[str, Any], room: int, max_turns: int) -> dict[str, Any]:
    key = {"Authorization": f"Bearer {server['api_key']}"}
    opened = httpx.post(server["sessions"], json={"task": room}, headers=key, timeout=600)
    if opened.status_code == 410:
        raise JobFinishedError(opened.json()["error"]["message"])
    opened.raise_for_status()
    session = opened.json()
    client = openai.OpenAI(base_url=session["base_url"], api_key=server["api_key"], max_retries=0)
    env = agentgym.make("sokoban")
    observation, info = env.reset(seed=room)
    messages = [
        {"role": "system", "content": env.unwrapped.instructions},  # type: ignore[attr-defined]
        {"role": "user", "content": observation},
    ]
    score = 0.0
    for _ in range(max_turns):
        try:
            reply = client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
        except openai.BadRequestError as error:
            if error.code != "context_length_exceeded":
                raise
            break  # the history outgrew the run's sequence_length: the episode ends here
        action = reply.choices[0].message.content or ""
        observation, reward, terminated, truncated, info = env.step(action)
        score += float(reward)
        if terminated or truncated:
            break
        messages += [
            {"role": "assistant", "content": action},
            {"role": "user", "content": observation},
        ]
    client.close()
    success = bool(info.get("success", False))
    feedback = httpx.post(
        f"{server['url']}/s/{session['session']}/feedback",
        json={"reward": score, "success": success},
        headers=key,
        timeout=60,
    )
    feedback.raise_for_status()
    return {"session": session["session"], "room": room, "reward": score, "success": success}


def main(address: Path, out: Path, group_size: int, max_turns: int) -> None:
    while not address.exists():
        time.sleep(0.2)
    server = json.loads(address.read_text())
    room = 0
    with ThreadPoolExecutor(2 * group_size) as pool:
        while True:
            rooms = [room] * group_size + [room + 1] * group_size
            futures = [pool.submit(play, server, r, max_turns) for r in rooms]
            finished = []
            for future in futures:
                # a session the job ended under was not trained: it is not written down
                with suppress(JobFinishedError, httpx.HTTPError, openai.APIError):
                    finished.append(future.result())
            with out.open("a") as handle:
                handle.write("".join(json.dumps(line) + "\n" for line in finished))
            if len(finished) < len(rooms):
                return
            room += 2


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
