"""What the asyncio tests share: a loop-lag meter and a counting compute.

No pytest plugin: each test runs its scenario with ``asyncio.run``, so every
task in it is a real task of one real event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

TICK = 0.001
STALL_LIMIT = 0.010  # the bound on how long a waiting task may hold up the loop


class LagMeter:
    """A task that wakes every millisecond and records the longest it was kept waiting.

    A call that blocks the event loop (a ``time.sleep``, a socket read without
    ``await``) shows up as a wake-up that came that much later than asked.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LagMeter:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK)
            self.worst = max(self.worst, loop.time() - before - TICK)
            self.ticks += 1


class Computes:
    """A coroutine-function compute that counts its calls and takes ``seconds``."""

    def __init__(self, value: Any = "computed", seconds: float = 0.0) -> None:
        self.value = value
        self.seconds = seconds
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return self.value


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a new event loop and return its result."""
    return asyncio.run(scenario())


def least_stall(scenario: Callable[[int], Coroutine[Any, Any, float]], attempts: int = 3) -> float:
    """The least loop stall over up to ``attempts`` runs of ``scenario(attempt)``.

    Each run returns its :class:`LagMeter`'s worst.  Code that blocks the loop
    stalls it on every run; a machine shared with other processes (or a full
    garbage collection) only now and then, so one quiet run is enough to tell
    them apart.  ``attempt`` lets a scenario use fresh keys.
    """
    best = math.inf
    for attempt in range(attempts):
        gc.collect()  # not in the middle of the measurement
        best = min(best, asyncio.run(scenario(attempt)))
        if best < STALL_LIMIT:
            break
    return best
