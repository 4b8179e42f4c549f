"""Commands as data: the plans a Store command is written as, and how a driver runs them.

A command (:mod:`.commands`) is a function from its arguments to a *plan*,
written once for both drivers:

* a :class:`Call`, one round trip to the server of a key (most commands), or
* a generator that yields *ops* (:class:`Call`, :class:`FanOut`,
  :class:`HomeToken`, :class:`Each`, :class:`Forget`) and receives each op's result, for a
  command of several steps (a text ``delete_cas``: ``gets``, then ``cas``).

Nothing here does I/O.  A driver runs a plan with :meth:`Runs.run`: the sync
:class:`~..client.cluster.Cluster` returns the result, the asyncio
:class:`~..client.aio.AsyncCluster` awaits it.  Which server answers, what a
failure means and what is observed are the driver's (and its round-trip
primitive's) business; a plan only says what to send and what the replies mean.

:class:`command` turns a plan function into a method of both drivers: on
``Cluster`` a plain method, on ``AsyncCluster`` a coroutine, with the plan's
signature (checked by mypy through the descriptor's overloads).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from types import GeneratorType
from typing import (
    Any,
    Concatenate,
    Final,
    Generic,
    ParamSpec,
    Protocol,
    Self,
    TypeAlias,
    TypeVar,
    overload,
)

from ..keys import Key
from .wire import Request

__all__ = [
    "MISS",
    "Call",
    "CopyToken",
    "Each",
    "Exchange",
    "FanOut",
    "Forget",
    "HomeToken",
    "Plan",
    "Runs",
    "RunsAsync",
    "command",
    "immediately",
    "then",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
R_co = TypeVar("R_co", covariant=True)

MISS: Final[Any] = object()  # a decoder's "no value here": the Call answers its ``failed``

Batch: TypeAlias = "Request[Any] | tuple[Request[Any], ...]"


class CopyToken(bytes):
    """A cas token read from a copy, not from the key's home, with the item it came with.

    A copy's token means nothing on the home.  A ``cas`` given one first reads
    the home's item and token (:class:`HomeToken`): the swap goes ahead, with
    the home's token, only if the home holds the very item (data and flags)
    the copy handed out; else it is "not stored", as for a changed token.
    """

    data: bytes
    flags: int

    def __new__(cls, token: bytes, data: bytes, flags: int) -> CopyToken:
        made = super().__new__(cls, token)
        made.data = data
        made.flags = flags
        return made


class Call(Generic[R]):
    """One round trip to the server the ring names for ``ring`` (a key's route).

    ``request`` is one request (``decode`` gets its reply) or a tuple written
    at once (``decode`` is None: the result is the list of replies, and a
    command the server does not know raises).  ``failed`` is the answer when
    the server cannot be used and the view degrades, and when ``decode``
    answers :data:`MISS`.  ``spread``: a caller's read, which may be served
    by any replica of a replicated key (tokens marked as a copy's).
    """

    __slots__ = ("decode", "failed", "request", "ring", "spread")

    def __init__(
        self,
        ring: bytes,
        request: Batch,
        decode: Callable[[Any], R] | None,
        failed: R,
        spread: bool = False,
    ) -> None:
        self.ring = ring
        self.request = request
        self.decode = decode
        self.failed = failed
        self.spread = spread

    def __repr__(self) -> str:
        return f"Call({self.ring!r}, {self.request!r})"


class Exchange(Protocol[R_co]):
    """What one server of a multi-key command gets for its keys, and what its replies mean."""

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        """The requests one server gets for these keys (written at once)."""
        ...

    def result(self, replies: list[Any], kbs: list[bytes]) -> R_co:
        """What that server's replies to :meth:`requests` amount to."""
        ...

    def failed(self, kbs: list[bytes]) -> R_co:
        """The result for keys whose server could not be used."""
        ...


class FanOut(Generic[R]):
    """A multi-key command: every server gets its keys' requests, written before any
    reply is read; the result is one ``R`` per server (or per key re-read).

    ``spread``: reads may take any live replica of a replicated key; ``write``:
    a replicated key is written to all of its replicas, and the gutter takes
    writes for a dead server.
    """

    __slots__ = ("exchange", "given", "spread", "write")

    def __init__(
        self,
        exchange: Exchange[R],
        given: Mapping[bytes, Key],
        *,
        spread: bool = False,
        write: bool = False,
    ) -> None:
        self.exchange = exchange
        self.given = given
        self.spread = spread
        self.write = write


class HomeToken:
    """The home server's cas token for a key read from a copy (``CopyToken``), or None.

    None unless the home holds the very item the copy handed out.
    """

    __slots__ = ("kb", "token")

    def __init__(self, kb: bytes, token: CopyToken) -> None:
        self.kb = kb
        self.token = token


class Forget:
    """Run ``request`` (a ``delete`` of ``kb``, or a ``set`` that replaces it) on the key's
    server now, or journal it there: the server runs it before it serves again.

    The result is True when it ran now, False when it was journaled.
    """

    __slots__ = ("kb", "request", "ring")

    def __init__(self, ring: bytes, kb: bytes, request: Request[Any]) -> None:
        self.ring = ring
        self.kb = kb
        self.request = request


class Each(Generic[R]):
    """``request`` on every server, one after another (``gutter``: the gutter pool's too,
    or ``only_gutter``: its servers instead); one result per server, by node name.

    ``tolerant``: a server that cannot be used or refuses the command is left
    out (``stats``), where otherwise it answers ``failed`` or raises (strict).
    """

    __slots__ = ("decode", "failed", "gutter", "only_gutter", "request", "tolerant")

    def __init__(
        self,
        request: Request[Any],
        decode: Callable[[Any], R],
        failed: R,
        *,
        gutter: bool = False,
        only_gutter: bool = False,
        tolerant: bool = False,
    ) -> None:
        self.request = request
        self.decode = decode
        self.failed = failed
        self.gutter = gutter
        self.only_gutter = only_gutter
        self.tolerant = tolerant


Op: TypeAlias = "Call[Any] | FanOut[Any] | HomeToken | Each[Any] | Forget"
Plan: TypeAlias = "Call[R] | Generator[Any, Any, R]"


def immediately(value: T) -> Generator[Any, Any, T]:
    """A plan that answers ``value`` without I/O."""
    yield from ()  # a generator that yields nothing
    return value


def then(step: Any, after: Callable[[Any], R]) -> Generator[Any, Any, R]:
    """A plan that runs ``step`` (a plan or an op), then answers ``after`` of its result."""
    result = (yield from step) if isinstance(step, GeneratorType) else (yield step)
    return after(result)


class Runs(Protocol):
    """A driver that returns a plan's result (:class:`~..client.cluster.Cluster`)."""

    def run(self, plan: Plan[T]) -> T: ...


class RunsAsync(Protocol):
    """A driver whose result is awaited (:class:`~..client.aio.AsyncCluster`)."""

    def run(self, plan: Plan[T]) -> Coroutine[Any, Any, T]: ...


class command(Generic[P, R]):
    """A Store command on both drivers (a decorator in :class:`.commands.StoreCommands`).

    For mypy it is a descriptor: on a :class:`Runs` driver a method with the
    plan's parameters returning ``R``, on a :class:`RunsAsync` one the same
    returning a coroutine.  At run time each driver class gets a real method
    per command (:func:`install`), so a call costs no descriptor lookup.
    """

    def __init__(self, plan: Callable[Concatenate[Any, P], Plan[R]]) -> None:
        self.plan = plan

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, obj: RunsAsync, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __get__(self, obj: Runs, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self
        raise TypeError(f"{owner.__name__} runs no plans: subclass StoreCommands with a run()")


def install(driver: type[Any], asynchronous: bool) -> None:
    """Give ``driver`` a method per :class:`command` of its bases (``asynchronous``: coroutines).

    Each method has its plan's exact signature (made with ``exec``, as
    :mod:`dataclasses` makes ``__init__``): ``cluster.get(key)`` costs one
    call more than the plan, with no ``*args`` packing on the hot path.
    """
    for klass in reversed(driver.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, command) and name not in vars(driver):
                setattr(driver, name, _method(name, value.plan, asynchronous, driver))


def _method(name: str, plan: Callable[..., Any], asynchronous: bool, driver: type[Any]) -> Any:
    parameters = list(inspect.signature(plan).parameters.values())[1:]
    namespace: dict[str, Any] = {"plan": plan}
    declared: list[str] = []
    passed: list[str] = []
    keyword_only = False
    for parameter in parameters:
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            declared.append("*")
            keyword_only = True
        text = parameter.name
        if parameter.default is not parameter.empty:
            namespace[f"_default_{text}"] = parameter.default
            text += f"=_default_{text}"
        declared.append(text)
        passed.append(f"{parameter.name}={parameter.name}" if keyword_only else parameter.name)
    head = "async def" if asynchronous else "def"
    run = "await self.run" if asynchronous else "self.run"
    source = (
        f"{head} {name}(self, {', '.join(declared)}):\n"
        f"    return {run}(plan(self, {', '.join(passed)}))\n"
    )
    exec(source, namespace)
    method = namespace[name]
    method.__qualname__ = f"{driver.__name__}.{name}"
    method.__module__ = driver.__module__
    method.__doc__ = plan.__doc__
    method.__wrapped__ = plan
    return method
