"""The one wait loop of a decoupled job: an explorer waiting for weights or for room
under the staleness bound, a trainer waiting for groups. Each says what it waits for
(at once where asked, then every :data:`LOG_SECONDS`), does its own work at each look
(an explorer tells the buffer it is alive, the trainer gives up silent explorers'
slots), and gives up after its timeout with an error that names what it
waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TypeVar

_T = TypeVar("_T")

LOG_SECONDS = 60.0
"""How often a waiting process says what it waits for."""
POLL_SECONDS = 0.2
"""How often a waiting process looks again."""


@dataclass(eq=False)
class Waiting:
    """One wait, ticked once per look.

    Attributes:
        what: The line that says what is awaited (called when it is said).
        log: Where the line goes.
        on_look: Called at each look that found nothing (an explorer's heartbeat).
        timeout: Seconds after which :meth:`tick` raises ``give_up``'s error (None: never).
        give_up: The error for a wait past ``timeout``, from the seconds waited.
        say_first: Say the line at the first look too, not only after a minute.
        poll_seconds: The pause between looks.
        log_seconds: How often the line is said.
    """

    what: Callable[[], str]
    _: KW_ONLY
    log: Callable[[str], None]
    on_look: Callable[[], None] | None = None
    timeout: float | None = None
    give_up: Callable[[float], Exception] | None = None
    say_first: bool = False
    poll_seconds: float = POLL_SECONDS
    log_seconds: float = LOG_SECONDS
    started: float = field(init=False)
    _said: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self._said = None if self.say_first else self.started  # else a minute in

    @property
    def waited(self) -> float:
        """Seconds since the wait began."""
        return time.monotonic() - self.started

    def tick(self) -> None:
        """One look that found nothing: give up past the timeout, say the line when it
        is due, then :attr:`on_look`.

        Raises:
            Exception: ``give_up``'s error, once the wait is longer than ``timeout``.
        """
        now = time.monotonic()
        if self.timeout is not None and now - self.started > self.timeout:
            if self.give_up is None:
                raise TimeoutError(f"{self.what()}: gave up after {self.timeout:g} s")
            raise self.give_up(now - self.started)
        if self._said is None or now - self._said >= self.log_seconds:
            self._said = now
            self.log(self.what())
        if self.on_look is not None:
            self.on_look()

    def until(self, ready: Callable[[], _T | None]) -> _T:
        """Look with ``ready`` until it gives something (ticking and pausing between
        looks); what it gave."""
        while (found := ready()) is None:
            self.tick()
            time.sleep(self.poll_seconds)
        return found

    async def pause(self) -> None:
        """The pause between two looks, on the event loop."""
        await asyncio.sleep(self.poll_seconds)
