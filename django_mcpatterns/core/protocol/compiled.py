"""The compiled hot path, when it is built: one place decides whether it runs.

The protocol layer's hot path exists twice, with the same answers: in Python
(:class:`~.reader.Reader`, the requests' ``encode`` methods, the sync
transport's socket calls) and in C (``_speedups``, built from ``src/speedups/``
where a compiler exists).  The C :class:`Reader` parses as the Python one does
(a hypothesis test feeds both the same byte streams split at random points)
and adds the sync transport's I/O on a blocking socket: a request is encoded,
sent, received and its reply scanned with the GIL released once, so threads
sharing a cluster overlap there as pylibmc's do.

``DJANGO_MCPATTERNS_PURE_PYTHON=1`` (read at import) runs the pure-Python path
even where the compiled one is built (CI runs the contract suites on both).
The compiled module is bound to the classes of one interpreter, the first to import
this package; another (a sub-interpreter, as mod_wsgi's application groups are) runs
the pure-Python path.

:data:`COMPILED`
    Whether the compiled path runs in this process.
:data:`Reader`
    The reader connections use: the compiled one, else the Python one.
:func:`encode`
    The bytes of a batch of requests, written at once.
:func:`keyed`, :func:`grouped`, :func:`decoded`, :func:`hits`
    A multi-key command's bookkeeping: its keys' wire bytes, grouped by server,
    its values by key, then by the keys as given.
:func:`async_trip`, :func:`async_runner`, :func:`resolve`
    AsyncCluster's round trip of a lone get/gets on a healthy server, as one C
    awaitable (``src/speedups/trip.c``), or None on the pure-Python path; and its
    ``run`` method, whose hot path makes that awaitable in C; a batch's result handed
    to its waiters (the compiled ones' tasks woken from one loop callback).
:func:`placed`, :data:`new_call`, :func:`value_decoder`
    A key's wire and ring bytes, a plan's Call and a get's decoder, made in C on
    the hot path (a plain key, a Call's five fields, an item of a plain format).
:func:`near`
    The near cache's hit, miss and fill (``NearTable.hit``, ``.missed``, ``.fill``), in C.
:data:`pack_rows`, :data:`unpack_rows`, :data:`columns`, :data:`unpack_columns`
    The ORM's cached rows (``orm/rows.py``: the pure form, and what they do), in C;
    None on the pure-Python path.
:func:`shape_walker`
    The walk of an ORM query's key (``orm/shape.py``: its loops), in C; None on the
    pure-Python path.
:func:`maker`, :data:`new_get`, :data:`new_store`
    The hot path's requests made from all their fields, positionally (in C:
    a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, the largest cost of a ``get`` left in Python).
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import importlib
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from ..exceptions import ProtocolError
from ..keys import Key, KeyT, Routed
from ..keys import placed as placed_in_python
from ..values.envelope import STALE, Envelope
from ..values.refusals import REFUSED
from . import reader
from .plans import Call
from .wire import NEED_DATA, ErrorReply, Get, MetaReply, Request, Store, Value
from .wire import encode as encode_in_python

__all__ = [
    "COMPILED",
    "PURE_SWITCH",
    "ConnectionClosedError",
    "Reader",
    "async_runner",
    "async_trip",
    "columns",
    "decoded",
    "encode",
    "grouped",
    "hits",
    "keyed",
    "load",
    "maker",
    "near",
    "new_call",
    "new_get",
    "new_store",
    "pack_rows",
    "placed",
    "resolve",
    "shape_walker",
    "unpack_columns",
    "unpack_rows",
    "value_decoder",
    "why_pure",
]

PURE_SWITCH = "DJANGO_MCPATTERNS_PURE_PYTHON"
ABI = 10  # what this module expects of _speedups (its ABI constant)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H", bound=Callable[..., Any])
M = TypeVar("M", bound=Callable[..., Any])
E = TypeVar("E")

why_pure = ""  # why the pure-Python path runs, when it does


class ConnectionClosedError(ConnectionError):
    """The server closed the connection before its reply was complete.

    Raised by both transports (and the compiled I/O, hence its place here).
    """


def load() -> ModuleType | None:
    """The compiled module, bound to this package's classes; None where it cannot run."""
    global why_pure
    if os.environ.get(PURE_SWITCH, "") not in ("", "0"):
        why_pure = f"{PURE_SWITCH} is set"
        return None
    try:
        module = importlib.import_module(f"{__package__}._speedups")
    except ImportError as exc:
        why_pure = f"not built ({exc})"
        return None
    if getattr(module, "ABI", None) != ABI:
        why_pure = f"built from other sources (ABI {getattr(module, 'ABI', None)}, not {ABI})"
        return None
    try:
        module.bind(
            ProtocolError=ProtocolError,
            ConnectionClosedError=ConnectionClosedError,
            ErrorReply=ErrorReply,
            MetaReply=MetaReply,
            Value=Value,
            NEED_DATA=NEED_DATA,
            Get=Get,
            Store=Store,
        )
    except ImportError as exc:  # bound in another interpreter (a sub-interpreter's import)
        why_pure = str(exc)
        return None
    if hasattr(module, "bind_meta"):  # meta replies made field by field (see maker)
        module.bind_meta(module.Maker(MetaReply, [f.name for f in dataclasses.fields(MetaReply)]))
    return module


speedups = load()
COMPILED = speedups is not None
Reader: Any = speedups.Reader if speedups is not None else reader.Reader


def encode(requests: Sequence[Request[Any]] | Iterable[Request[Any]]) -> bytes:
    """The bytes of a batch of requests (:func:`.wire.encode`, in C when compiled)."""
    if speedups is not None:
        kind = type(requests)  # a tuple or list as it is: isinstance of an ABC runs Python
        plain = kind is tuple or kind is list or isinstance(requests, Sequence)
        data: bytes = speedups.encode(requests if plain else list(requests))
        return data
    return encode_in_python(requests)


def keyed(keys: Iterable[KeyT]) -> dict[bytes, KeyT]:
    """``{wire bytes: key as given}`` of a multi-key command (:func:`~..keys.placed` each)."""
    if speedups is not None:
        given: dict[bytes, KeyT] = speedups.keyed(keys, placed_in_python)
        return given
    return {placed_in_python(key)[0]: key for key in keys}


def value_decoder(
    direct: dict[int, Callable[[bytes], Any]], slow: Callable[[Any], Any], miss: object
) -> Callable[[Any], Any]:
    """A get's reply decoder: ``slow`` (``Decoders._value``), or its compiled front that
    decodes one item of a ``direct`` format itself and answers ``miss`` for none
    (``slow``'s own answers: the pure path's, to the object)."""
    if speedups is None or type(direct) is not dict:
        return slow
    decode: Callable[[Any], Any] = speedups.ValueDecoder(direct, slow, miss)
    return decode


def decoded(
    values: Sequence[Value],
    direct: Mapping[int, Callable[[bytes], Any]],
    deserialize: Callable[[Any, bytes, int], Any],
    cas: bool,
) -> dict[bytes, Any]:
    """A get's values by key, decoded: by ``direct[flags]`` (a plain format) where there is
    one and it accepts the data, else by the serde's ``deserialize``; ``cas``: with tokens."""
    if speedups is not None and type(direct) is dict:
        found: dict[bytes, Any] = speedups.decoded(values, direct, deserialize, cas)
        return found
    found = {}
    for v in values:
        decode = direct.get(v.flags)
        if decode is None:
            value = deserialize(v.key, v.data, v.flags)
        else:
            try:
                value = decode(v.data)
            except ValueError:  # not what its flags say: the serde refuses it
                value = deserialize(v.key, v.data, v.flags)
        found[v.key] = (value, v.cas) if cas else value
    return found


def async_trip(
    batch: type, answered: Callable[..., None], miss: object, armed: Any, completed: list[int]
) -> Callable[..., Coroutine[Any, Any, Any]] | None:
    """The compiled twin of ``AsyncCluster._trip``'s hot path, bound to the async driver's
    ``Batch`` class, ``answered`` judge, ``MISS``, fork guard and completion stamp
    (channel.py's ``fetch_one`` runs in C too); None on the pure path.

    ``trip(cluster, node, request, decode, failed, admission)`` is an awaitable (a
    registered ``Coroutine``) answering as ``cluster._trip(node, request, decode, failed,
    admission, True, True)``: it runs that coroutine itself whenever the request is not
    a lone get on a live channel without observer, probe or fork to see to.
    """
    if speedups is None:
        return None
    speedups.bind_trip(
        batch,
        asyncio.CancelledError,
        asyncio.get_running_loop,
        answered,
        miss,
        armed,
        completed,
        asyncio.Future,
        asyncio.BaseEventLoop.create_future,
    )
    collections.abc.Coroutine.register(speedups.Trip)
    trip: Callable[..., Coroutine[Any, Any, Any]] = speedups.trip
    return trip


def resolve_in_python(waiters: list[Any], result: Any) -> None:
    """Each waiter still pending gets ``result`` (a cancelled caller's is dropped)."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(result)


# A batch's result to its waiters: in C, the compiled get's waiters (src/speedups/waiter.c)
# wake their tasks from one loop callback instead of one each.
resolve: Callable[[list[Any], Any], None] = (
    speedups.resolve if speedups is not None else resolve_in_python
)


def async_runner(run: Callable[..., Any]) -> Callable[..., Any]:
    """``AsyncCluster.run`` with its hot path in C (a healthy server's Call becomes the
    awaitable of :func:`async_trip` with no Python frame), ``run`` itself for any other
    plan; ``run`` as it is on the pure path."""
    if speedups is None:
        return run
    runner: Callable[..., Any] = speedups.Runner(run, Call)
    return runner


def near(
    entry: type[E],
    table: type[T],
    miss: object,
    sizes: tuple[int, int, int],
    fill: F,
    hit: H,
    missed: M,
) -> tuple[F, H, M, Callable[[E], E]]:
    """The near table's ``fill(table, key, value, ticket)``, ``hit(table, key)`` and
    ``missed(table)`` (``NearTable.fill``, ``.hit`` and ``.missed``, given), in C where the
    hot path is built
    (``src/speedups/near.c``: the same answers and table; a fill's common case only, a
    str or bytes value, room, its sweep included), bound to the table's ``Entry`` and
    ``NearTable`` classes, its ``MISS`` and ``sizes`` (what an empty str and bytes take,
    and an entry's fixed overhead); those given on the pure path.  Fourth, ``untrack``:
    an entry given back, no longer followed by the cycle collector (no cycle passes
    through an entry; near.c says why), or as it is on the pure path."""
    if speedups is None:
        return fill, hit, missed, _same
    speedups.bind_near(entry, table, miss, collections.deque, type(threading.Lock()), *sizes)
    return speedups.near_fill, speedups.near_hit, speedups.near_missed, speedups.near_untrack


def _same(entry: E) -> E:
    return entry


def maker(cls: type[T], *, checked: bool = False) -> Callable[..., T]:
    """A maker of ``cls`` from all its fields, positionally: compiled where ``cls`` is a frozen
    slots dataclass whose ``__init__`` only stores them, else ``cls`` itself.

    ``checked``: ``cls`` has a ``__post_init__`` that only checks its fields, and the
    caller only ever passes fields it accepts (the maker does not run it).
    """
    names = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    plain = (
        speedups is not None
        and (checked or not hasattr(cls, "__post_init__"))
        and all(field.init for field in dataclasses.fields(cls))  # type: ignore[arg-type]
        and set(names) <= set(getattr(cls, "__slots__", ()))
    )
    if speedups is None or not plain:
        return cls
    made: Callable[..., T] = speedups.Maker(cls, names)
    return made


new_get: Callable[[Sequence[bytes], bool], Get] = maker(Get)
pack_rows: Callable[..., list[Any] | None] | None = getattr(speedups, "pack_rows", None)
unpack_rows: Callable[..., list[Any]] | None = getattr(speedups, "unpack_rows", None)
columns: Callable[[list[Any]], Any] | None = getattr(speedups, "columns", None)
unpack_columns: Callable[..., list[Any]] | None = getattr(speedups, "unpack_columns", None)


Walk = Callable[[Any, Any], None]
"""``walk(value, shape)``: a value written down into a shape's parts."""
WalkNamed = Callable[[dict[str, Any], tuple[str, ...], Any], None]
"""``walk_named(state, names, shape)``: each name and its value in ``state``, written down."""


def shape_walker(
    handlers: dict[type, Callable[..., None]], *functions: Any
) -> tuple[Walk, WalkNamed] | None:
    """``orm/shape.py``'s ``_walk`` and the loop of its ``_query``, compiled and bound to its
    ``handlers`` and ``functions`` (see ``src/speedups/shape.c``); None on the pure path
    (or where another interpreter bound them)."""
    module = speedups
    if module is None or not hasattr(module, "shape_bind"):
        return None
    try:
        module.shape_bind(handlers, *functions)
    except ImportError:
        return None
    return module.shape_walk, module.shape_named


# keys.placed(key): a key's (wire, ring) bytes, a plain key's made in C when compiled.
placed: Callable[[Key], tuple[bytes, bytes]] = (
    partial(speedups.placed, placed_in_python) if speedups is not None else placed_in_python
)
# A plan's Call from its five fields, positionally (``spread`` too): made in C when compiled.
new_call: Callable[..., Call[Any]] = (
    speedups.Maker(Call, ("ring", "request", "decode", "failed", "spread"))
    if speedups is not None
    else Call
)
new_store: Callable[[Any, bytes, bytes, int, int, bytes | int | None], Store] = maker(Store)


def grouped(
    given: Mapping[bytes, Key], locate: Callable[[bytes], str], known: Mapping[bytes, str]
) -> dict[str, list[bytes]]:
    """The wire bytes of ``given``'s keys by server, servers in the order they first come.

    A :class:`~..keys.Routed` key is placed by its route's bytes; ``known`` is the
    remembered server of ring bytes (:func:`~..client.routing.remembered`), ``locate``
    the ring's answer for the others.
    """
    if speedups is not None and type(given) is dict and type(known) is dict:
        owned: dict[str, list[bytes]] = speedups.grouped(given, locate, known, Routed)
        return owned
    owned = {}
    for kb, key in given.items():
        ring = key.route if type(key) is Routed else kb
        name = known.get(ring)
        if name is None:
            name = locate(ring)
        kbs = owned.get(name)
        if kbs is None:
            kbs = owned[name] = []
        kbs.append(kb)
    return owned


def hits(parts: list[dict[bytes, Any]], given: Mapping[bytes, Key], cas: bool) -> dict[Key, Any]:
    """The fetched items by the keys as given; refused ones are misses, left in place.

    An item the serde refused may be another client's (PHP, Java, pylibmc on
    the same ring): a read never deletes it (serializers.py).
    """
    if speedups is not None and type(given) is dict:
        answer: dict[Key, Any] = speedups.hits(parts, given, cas, STALE, REFUSED, Envelope)
        return answer
    found: dict[Key, Any] = {}
    for part in parts:
        for kb, item in part.items():
            value = item[0] if cas else item
            # Past its soft expiry (left for get_or_compute), or refused: a miss.
            if value is STALE or value is REFUSED:
                continue
            if type(value) is not Envelope or value.value is not REFUSED:  # is_refused, inlined
                found[given[kb]] = item
    return found
