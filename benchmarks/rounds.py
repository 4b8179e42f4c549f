"""Interleaved rounds and their statistics, shared by the benchmark scripts.

A shared machine's load moves every few seconds, so no contender gets a quiet stretch
to itself: every round runs one short block of each contender, in an order that
rotates from round to round, and the figures are medians over the rounds with their
spread.  A ratio is taken round by round (both of its sides ran within a second of
each other), then its median: load that moves between rounds cancels out.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One block's wall-clock and process CPU time (user + system), in seconds per op."""

    wall: float
    cpu: float


def timed(fn: Callable[[], object], ops: int) -> Sample:
    """Run ``fn`` ``ops`` times; per-op wall time and process CPU time of the whole block."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(ops):
        fn()
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    return Sample(wall / ops, cpu / ops)


def interleave(
    blocks: Mapping[str, Callable[[], Sample]],
    rounds: int,
    errors: dict[str, str] | None = None,
) -> dict[str, list[Sample]]:
    """Each block once a round for ``rounds`` rounds, the order rotating each round.

    With ``errors``, a block that raises is dropped from then on (and from the result)
    and its error noted there; without, the error propagates.
    """
    names = list(blocks)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if errors is not None and name in errors:
                continue
            try:
                samples[name].append(blocks[name]())
            except Exception as exc:
                if errors is None:
                    raise
                errors[name] = f"round {r + 1}: {type(exc).__name__}: {exc}"
    return {name: s for name, s in samples.items() if errors is None or name not in errors}


@dataclass(frozen=True)
class Figure:
    """A median and the spread around it: the 25th and 75th percentiles of the rounds."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Figure:
        xs = sorted(values)
        if len(xs) == 1:
            return cls(xs[0], xs[0], xs[0])
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(statistics.median(xs), q1, q3)

    def scaled(self, factor: float) -> Figure:
        return Figure(self.median * factor, self.low * factor, self.high * factor)

    def inverted(self) -> Figure:
        """1/x of each bound (seconds per op to ops per second): low and high swap."""
        return Figure(1 / self.median, 1 / self.high, 1 / self.low)

    def show(self, digits: int = 2) -> str:
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def ratio(ours: list[float], theirs: list[float]) -> Figure:
    """Ours over theirs, round by round (the lists are aligned by round)."""
    return Figure.of(a / b for a, b in zip(ours, theirs, strict=True))
