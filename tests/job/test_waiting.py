"""The job's one wait loop: what it says and when, its work at each look, giving up."""

from __future__ import annotations

import pytest

from agentgym.job import waiting
from agentgym.job.waiting import Waiting


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock the test moves by hand; the pauses between looks take no time."""
    now = [100.0]
    monkeypatch.setattr(waiting.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(waiting.time, "sleep", lambda seconds: None)
    return now


def test_the_line_is_said_every_log_interval_and_at_once_when_asked(clock: list[float]) -> None:
    said: list[str] = []
    looks: list[float] = []
    wait = Waiting(lambda: f"waits at {clock[0]:g}", log=said.append,
                   on_look=lambda: looks.append(clock[0]), log_seconds=60)  # fmt: skip
    for _ in range(4):  # looks at 100, 130, 160, 190
        wait.tick()
        clock[0] += 30
    assert said == ["waits at 160"]  # a minute after it began, not at once
    assert looks == [100, 130, 160, 190]
    first = Waiting(lambda: "first", log=said.append, say_first=True)
    first.tick()
    first.tick()
    assert said[-1:] == ["first"] and said.count("first") == 1


def test_a_wait_past_its_timeout_raises_the_named_error(clock: list[float]) -> None:
    wait = Waiting(lambda: "weights", log=print, timeout=10,
                   give_up=lambda waited: LookupError(f"gave up after {waited:g} s"))  # fmt: skip
    clock[0] += 10
    wait.tick()  # at the limit: still waiting
    clock[0] += 1
    with pytest.raises(LookupError, match="gave up after 11 s"):
        wait.tick()
    plain = Waiting(lambda: "groups", log=print, timeout=0)
    clock[0] += 1
    with pytest.raises(TimeoutError, match="groups: gave up after 0 s"):
        plain.tick()


def test_until_returns_what_the_look_finds(clock: list[float]) -> None:
    answers = iter([None, None, "version 3"])
    looks: list[int] = []
    wait = Waiting(lambda: "v", log=print, on_look=lambda: looks.append(1))
    assert wait.until(lambda: next(answers)) == "version 3"
    assert len(looks) == 2  # one look per miss
