"""Stand-ins the tests inject instead of time and of a plain Store (style.md, habit 3).

:class:`FakeClock` is ``clock=`` and, through :meth:`FakeClock.sleep`, ``sleep=``:
time moves only when a test (or a sleep) says so.  :class:`Hooked` and
:class:`CountingStore` wrap a Store to record its requests and to run another
client's actions at an exact point of a protocol: a deterministic interleaving
instead of sleeping threads.  (``Hooked`` hooks once per operation and records
every call in order; ``CountingStore`` queues hooks and counts only the Store
protocol's requests.)
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from django_mcpatterns.core.locks import authoritative

START = 1_700_000_000.0  # a Unix time: exptimes over 30 days are absolute, as in memcached

STORE_METHODS = frozenset(
    {
        *("get", "gets", "get_many", "gets_many", "set", "set_many", "add"),
        *("gets_envelope", "get_many_envelopes"),
        *("append", "prepend", "cas", "incr", "decr", "delete", "delete_many", "touch", "ttl"),
        *("gets_ttl", "add_cas", "recas", "delete_cas"),
    }
)


class FakeClock:
    """Time that moves only when told to; ``sleep`` advances it and is recorded."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        """``sleep`` for asyncio code: advance the clock, then yield to the loop once."""
        self.sleep(seconds)
        await asyncio.sleep(0)


def near(seconds: Any) -> Any:
    """Equal up to float rounding at Unix-time magnitudes (2e-7 s per step)."""
    return pytest.approx(seconds, abs=1e-5)


class Hooked:
    """A Store wrapper that runs ``before[op](*args)`` before the store's ``op``.

    Lets a test slip another caller's actions in at an exact point of a
    protocol (a deterministic interleaving) and counts the requests made.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.before: dict[str, Callable[..., object]] = {}
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calling(name, args)
            return target(*args, **kwargs)

        return call

    def calling(self, name: str, args: tuple[Any, ...]) -> object:
        """Run the hook of ``name`` (once), then record the call; the hook's result."""
        hook = self.before.pop(name, None)
        done = None if hook is None else hook(*args)
        self.calls.append((name, args[0] if args else None))
        return done


class AsyncHooked(Hooked):
    """:class:`Hooked` over an AsyncStore: a hook may be a coroutine function, awaited.

    The asyncio tests' form (``tests/**/_async/``); their generated sync form uses
    :class:`Hooked`.  (The call is recorded before an awaited hook has run.)
    """

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.store, name)
        if not inspect.iscoroutinefunction(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            done = self.calling(name, args)
            if inspect.isawaitable(done):
                await done
            return await target(*args, **kwargs)

        return call


class CountingStore:
    """A Store wrapper: counts calls, logs their keys, runs hooks before them.

    Only the Store protocol's requests are counted and hooked; anything else
    passes through.  ``before(name, fn)`` runs ``fn`` (once) right before the
    next call of ``name``: a competing client acting between our read and our
    write.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.log: list[tuple[str, Any]] = []
        self._hooks: dict[str, list[Callable[[], object]]] = {}

    def before(self, name: str, fn: Callable[[], object]) -> None:
        self._hooks.setdefault(name, []).append(fn)

    def reset(self) -> None:
        self.calls.clear()
        self.log.clear()

    @property
    def requests(self) -> int:
        return sum(self.calls.values())

    def strict(self) -> CountingStore:
        """The inner store's strict view (``core/locks/``), counted and hooked here too."""
        view = CountingStore(authoritative(self.inner))
        view.calls, view.log, view._hooks = self.calls, self.log, self._hooks
        return view

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in STORE_METHODS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            hooks = self._hooks.get(name)
            if hooks:
                hooks.pop(0)()
            self.calls[name] += 1
            self.log.append((name, args[0] if args else None))
            return attr(*args, **kwargs)

        return call
