"""AsyncCluster: the Store protocol on memcached servers, for asyncio.

An :class:`AsyncCluster` answers exactly as :class:`~.cluster.Cluster` does
(the same Store contract suite runs on both), with its methods as coroutines
(:class:`~.store.AsyncStore`).  It is the *twin* of a Cluster: it shares that
cluster's ring, options, serde, listeners and each server's
:class:`~.health.NodeHealth` (one process view of a server, whichever API saw
it fail), and has connections of its own.  ``Cluster(...).aio`` returns the
twin (made once); ``AsyncCluster(servers, options)`` takes the constructor of
Cluster and makes a Cluster to be the twin of.

Connections
    One pipelined :class:`~.aio_transport.Channel` per server and event loop
    (:class:`_Links`), opened on first use: every task of the loop shares it,
    so commands issued in one loop iteration leave in one write and reads by
    key are batched and deduplicated (see :mod:`.aio_transport`).  A channel
    is never shared between loops, and a forked child never uses one it
    inherited (a pid check on every use: the child opens its own).
Routing, failover, outcomes
    As in Cluster, whose rules are reused, not copied: the ring and
    :meth:`Cluster._pick` choose the server, the decoders of :mod:`.cluster`
    judge replies, and :meth:`AsyncCluster._judge` records what a failure
    says in the shared health.  A failure once the channel is open leaves
    the outcome unknown (the strict view raises :class:`OutcomeUnknownError`).
Cancellation
    A cancelled task's request still gets its reply read by the channel and
    dropped, so a cancellation never leaves a connection out of step.
Threads
    None: no executor, no ``sync_to_async``; nothing here blocks the loop.
Instrumentation
    The twin reports to its cluster's observer (``Cluster.observer``, read on
    every request, so a sink the debug toolbar adds later is seen here too).
    A read by key is reported as the ``get``/``gets`` of its own keys, with
    the time its caller waited: reads of one loop iteration share a request
    on the wire, and each caller's outcome is its own.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from time import perf_counter_ns
from typing import Any, TypeVar, cast

from .aio_transport import Batch, Channel, NotSentError, open_channel
from .cluster import (
    _DELETE_MANY,
    _EXPIRED,
    _META_REQUESTS,
    _NO_CAS,
    _NO_CAS_TTL,
    _NODE_ERRORS,
    Cluster,
    Serde,
    _bumped_meta,
    _bumped_text,
    _cas_stored,
    _cas_token,
    _claim_batch,
    _claimed,
    _count,
    _deleted,
    _delta,
    _encoded,
    _Exchange,
    _expire,
    _first_value,
    _identity,
    _live,
    _meta_cas,
    _meta_deleted,
    _meta_swap,
    _no_meta,
    _no_refusal,
    _Node,
    _not_supported,
    _ok,
    _raw,
    _refusal_seen,
    _reply_error,
    _stats,
    _stored,
    _StoreMany,
    _swapped,
    _text_cas_token,
    _touched,
    _ttl,
    _value_cas_ttl,
    _written,
)
from .exceptions import (
    CommandNotSupportedError,
    NeedsMetaProtocolError,
    NodeUnavailableError,
    ProtocolError,
)
from .gutter import clamp
from .health import Admission, HealthSnapshot, NodeEvent
from .keys import Key, KeyT, placed
from .loops import at_shutdown
from .options import ClusterOptions
from .replicas import CopyToken
from .routes import FAILED, UNROUTED, Parallel, Plan, Refuse, Routes, Run
from .servers import Server
from .store import CasToken, Claimed
from .transport import ConnectionClosedError, SocketOptions
from .values.envelope import STALE
from .values.refusals import ValueRefused, is_refused
from .wire import (
    Delete,
    ErrorReply,
    FlushAll,
    Get,
    Incr,
    MetaDelete,
    MetaGet,
    MetaNoop,
    MetaSet,
    Request,
    Stats,
    Store,
    StoreCommand,
    Touch,
    Value,
    Version,
)

__all__ = ["AsyncCluster"]

R = TypeVar("R")

_getpid = os.getpid


class _Links:
    """One server's channels, one per event loop, owned by the process ``pid``.

    Shared by every AsyncCluster over the same server node (a twin and its
    strict view).  Channels of closed loops are dropped when another loop
    opens one; a forked child forgets its parent's without touching them
    (closing them there would be harmless to the parent, but their loop is
    the parent's, and its selector is shared with the parent).
    """

    __slots__ = ("_connecting", "address", "channels", "options", "pid")

    def __init__(self, address: str | tuple[str, int], options: SocketOptions) -> None:
        self.address = address
        self.options = options
        self.channels: dict[asyncio.AbstractEventLoop, Channel] = {}
        self._connecting: dict[asyncio.AbstractEventLoop, asyncio.Future[Channel]] = {}
        self.pid = _getpid()

    def current(self, loop: asyncio.AbstractEventLoop) -> Channel | None:
        """This loop's open channel, if any (the hot path: no await)."""
        if self.pid != _getpid():
            self._after_fork()
        channel = self.channels.get(loop)
        if channel is not None and channel.broken is None:
            return channel
        return None

    async def channel(self, loop: asyncio.AbstractEventLoop) -> Channel:
        """This loop's channel, connecting first if needed (concurrent callers share it)."""
        channel = self.current(loop)
        if channel is not None:
            return channel
        connecting = self._connecting.get(loop)
        if connecting is None:
            # A task of its own: a cancelled caller does not abort others' connect.
            connecting = loop.create_task(self._connect(loop))
            connecting.add_done_callback(_retrieved)  # callers may all have been cancelled
            self._connecting[loop] = connecting
        return await asyncio.shield(connecting)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Channel:
        try:
            channel = await open_channel(self.address, self.options)
        finally:
            self._connecting.pop(loop, None)
        # Loops of other threads may connect at the same time: each step is one dict
        # operation (atomic), and a closed loop's channel is ended by whoever pops it.
        for old in [other for other in list(self.channels) if other.is_closed()]:
            abandoned = self.channels.pop(old, None)
            if abandoned is not None:
                abandoned.abandon()  # its loop is gone: nothing can use it
        self.channels[loop] = channel
        await at_shutdown(self, self._shut)
        return channel

    async def _shut(self) -> None:
        """End the channel of a loop that shuts down (:mod:`.loops`), rather than leave it
        to the garbage collector."""
        channel = self.channels.pop(asyncio.get_running_loop(), None)
        if channel is not None:
            channel.fail(ConnectionClosedError("its event loop shut down"))
            await asyncio.sleep(0)  # the transport's connection_lost closes the socket

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close this loop's channel (once idle: requests held are answered first)."""
        channel = self.channels.pop(loop, None)
        if channel is not None:
            channel.close()

    def _after_fork(self) -> None:
        _inherited.extend(self.channels.values())  # never used, never touched (see above)
        self.channels = {}
        self._connecting = {}
        self.pid = _getpid()


def _retrieved(task: asyncio.Task[Channel]) -> None:
    """Mark a connect's failure as seen: its callers judge it, or were cancelled."""
    if not task.cancelled():
        task.exception()


# Channels a forked child inherited: kept referenced so their garbage collection
# does not touch the parent's event loop objects; the process exit closes them.
_inherited: list[Channel] = []


class AsyncCluster:
    """The :class:`~.store.AsyncStore` protocol on a cluster of memcached servers.

    Takes Cluster's constructor; :meth:`twin_of` (or ``Cluster.aio``) makes the
    twin of an existing Cluster instead.  See the module docstring.
    """

    def __init__(
        self,
        servers: Sequence[str | Server] | str,
        options: ClusterOptions | None = None,
        *,
        serde: Serde = None,
        on_node_event: Callable[[NodeEvent], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        cluster = Cluster(
            servers, options, serde=serde, on_node_event=on_node_event, clock=clock, rng=rng
        )
        self._adopt(cluster)
        cluster.__dict__["_aio"] = self

    @classmethod
    def twin_of(cls, cluster: Cluster) -> AsyncCluster:
        """The async twin of ``cluster`` (prefer ``cluster.aio``, which makes it once)."""
        twin = cls.__new__(cls)
        twin._adopt(cluster)
        return twin

    def _adopt(self, cluster: Cluster) -> None:
        self.sync = cluster
        self.servers = cluster.servers
        self.options = cluster.options
        self.serde = cluster.serde
        self.ring = cluster.ring
        self._nodes: dict[str, _Node] = cluster._nodes
        self._routes: Routes | None = cluster._routes  # replicas and the gutter (routes.py)
        every = [*self._nodes.values(), *cluster._gutter_nodes.values()]
        self._links: dict[_Node, _Links] = {node: _links_of(node) for node in every}
        self._locate = cluster._locate
        self._text = cluster._text
        self._deserialize = cluster._deserialize
        self._strict: AsyncCluster | None = None

    def __repr__(self) -> str:
        return f"<AsyncCluster {', '.join(self._nodes)} ketama={self.options.ketama}>"

    # -- reads by key: batched per loop iteration, deduplicated --

    async def get(self, key: Key, default: Any = None) -> Any:
        kb, ring = placed(key)
        item = await self._read_one(ring, kb, cas=False)
        if item is None:
            return default
        value = self._deserialize(item.key, item.data, item.flags)
        if value is STALE or is_refused(value):
            return default  # past its soft expiry (left for get_or_compute), or refused
        return value

    async def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        kb, ring = placed(key)
        item = await self._read_one(ring, kb, cas=True)
        if item is None:
            return _NO_CAS
        value = self._deserialize(item.key, item.data, item.flags)
        if value is STALE or is_refused(value):
            return _NO_CAS
        return value, item.cas

    async def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        kb, ring = placed(key)
        item = await self._read_one(ring, kb, cas=True)
        if item is None:
            return _NO_CAS
        value = self.serde.deserialize_envelope(item.key, item.data, item.flags)
        return _NO_CAS if is_refused(value) else (value, item.cas)

    async def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Return the hits only, keyed by the keys as given."""
        given = {placed(key)[0]: key for key in keys}
        items = await self._read_many(given, cas=False)
        deserialize = self._deserialize
        return self._hits(items, given, lambda item: deserialize(item.key, item.data, item.flags))

    async def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        given = {placed(key)[0]: key for key in keys}
        items = await self._read_many(given, cas=True)
        deserialize = self._deserialize
        return self._hits(
            items,
            given,
            lambda item: (deserialize(item.key, item.data, item.flags), item.cas),
            cas=True,
        )

    async def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        given = {placed(key)[0]: key for key in keys}
        items = await self._read_many(given, cas=False)
        envelope = self.serde.deserialize_envelope
        return self._hits(items, given, lambda item: envelope(item.key, item.data, item.flags))

    def _hits(
        self,
        items: dict[bytes, Value],
        given: Mapping[bytes, Key],
        decode: Callable[[Value], Any],
        cas: bool = False,
    ) -> dict[Key, Any]:
        """The decoded items by the keys as given (``cas``: decoded as (value, cas) pairs)."""
        hits: dict[Key, Any] = {}
        for kb, item in items.items():
            found = decode(item)
            value = found[0] if cas else found
            # Past its soft expiry (left for get_or_compute), or refused: a miss.
            if value is not STALE and not is_refused(value):
                hits[given[kb]] = found
        return hits

    async def _read_one(self, ring: bytes, kb: bytes, cas: bool) -> Value | None:
        routes = self._routes
        if routes is not None:  # replicated, or under the gutter policy: not batched
            strict = self.options.raise_errors
            request = Get((kb,), cas)
            if cas and routes.copies(kb, ring) > 1:  # a caller's gets: spread too
                plan = routes.spread_tokens(kb, request, _first_value, None, strict)
            else:
                plan = routes.single(ring, request, _first_value, None, strict)
            routed = await self._drive(plan)
            if routed is not UNROUTED:
                return routed  # type: ignore[no-any-return]
        node = self._nodes[self._locate(ring)]
        admission = node.health.open
        if admission is None:
            node, admission = self.sync._failover(ring, node, Get((kb,), cas))
            if admission is None:
                return self.sync._refused(node, None)
        loop = asyncio.get_running_loop()
        channel = self._links[node].current(loop)
        sent = channel is not None
        observer = self.sync.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            if channel is None:
                channel = await self._links[node].channel(loop)
                sent = True
            batch = await channel.fetch_one(kb, cas)
            if type(batch) is not Batch:
                raise _reply_error(batch)
        except asyncio.CancelledError as exc:
            if observer is not None:  # the slowest reads: still counted and timed
                observer.failed(node.name, Get((kb,), cas), exc, sent, started)
            self._cancelled(node, admission)
            raise
        except BaseException as exc:
            if observer is not None:
                observer.failed(node.name, Get((kb,), cas), exc, sent, started)
            error = self._judge(node, channel, exc, admission, sent)
            if error is None:
                return None
            raise error from error.__cause__
        self._done(node)
        item = batch.values.get(kb)
        if observer is not None:
            observer.request(node.name, Get((kb,), cas), [] if item is None else [item], started)
        return item

    async def _read_many(self, given: Mapping[bytes, Key], cas: bool) -> dict[bytes, Value]:
        """Every server's keys in its channel's batch of this iteration, then every reply."""
        if not given:
            return {}
        spread = None
        if self._routes is not None:
            await self._replay_all()
            spread = None if cas else self._routes.spread(given)
        found: dict[bytes, Value] = {}
        errors: list[BaseException] = []
        lost: set[str] = set()  # servers that failed this call (their spread keys are reread)

        def finish(node: _Node, kbs: list[bytes], batches: list[Any]) -> list[Value]:
            for batch in batches:
                if not isinstance(batch, Batch):
                    raise _reply_error(batch)
            mine: list[Value] = []
            for batch in batches:
                values = batch.values
                for kb in kbs:
                    item = values.get(kb)
                    if item is not None:
                        found[kb] = item
                        mine.append(item)
            return mine

        def failed(node: _Node, kbs: list[bytes], error: BaseException | None) -> None:
            if error is not None:
                errors.append(error)
            else:
                lost.add(node.name)

        await self._per_server(
            given,
            lambda node, channel, kbs: channel.fetch(kbs, cas),
            finish,
            failed,
            lambda kbs: Get(kbs, cas),
            owners=spread,
        )
        if errors:
            raise errors[0]
        if spread and lost:  # a replica chosen for some keys just failed: the others answer
            assert self._routes is not None
            strict = self.options.raise_errors
            for kb, name in spread.items():
                if name in lost:
                    plan = self._routes.reread(
                        kb, name, Get((kb,), cas), _first_value, None, strict
                    )
                    item = await self._drive(plan)
                    if item is not None:
                        found[kb] = item
        return found

    # -- single-key commands --

    async def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        return await self._store("set", key, value, expire)

    async def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        return await self._store("add", key, value, expire)

    async def append(self, key: Key, value: bytes) -> bool:
        return await self._store("append", key, _raw(value), 0)

    async def prepend(self, key: Key, value: bytes) -> bool:
        return await self._store("prepend", key, _raw(value), 0)

    async def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = await self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        request = Store("cas", kb, data, flags, _expire(expire), _cas_token(cas))
        failed: bool | None = False
        return await self._single(ring, request, _cas_stored, failed)

    async def incr(self, key: Key, delta: int = 1) -> int | None:
        kb, ring = placed(key)
        value: int | None = await self._single(ring, Incr(kb, _delta(delta)), _count, None)
        return value

    async def decr(self, key: Key, delta: int = 1) -> int | None:
        kb, ring = placed(key)
        request = Incr(kb, _delta(delta), decr=True)
        value: int | None = await self._single(ring, request, _count, None)
        return value

    async def delete(self, key: Key) -> bool:
        kb, ring = placed(key)
        return await self._single(ring, Delete(kb), _deleted, False)

    async def touch(self, key: Key, expire: int = 0) -> bool:
        kb, ring = placed(key)
        return await self._single(ring, Touch(kb, _expire(expire)), _touched, False)

    async def bump(self, key: Key) -> bool:
        """As :meth:`Cluster.bump`: meta ``mg <key>``, text ``add`` of an item already expired."""
        kb, ring = placed(key)
        if self._text:
            probe = Store("add", kb, b"", 0, _EXPIRED)
            return await self._single(ring, probe, _bumped_text, False)
        return await self._single(ring, MetaGet(kb), _bumped_meta, False)

    async def ttl(self, key: Key) -> int | None:
        """As :meth:`Cluster.ttl` (meta protocol only)."""
        kb, ring = placed(key)
        if self._text:
            raise NeedsMetaProtocolError(
                "ttl needs memcached's meta protocol (mg <key> t), and "
                "OPTIONS['protocol'] is 'text'",
                option="protocol",
            )
        return await self._single(ring, MetaGet(kb, ttl=True), _ttl, None)

    async def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> list[Any] | None:
        """As :meth:`Cluster.exchange`: wire requests to ``key``'s server in one write."""
        _, ring = placed(key)
        batch = tuple(requests)
        if self._text:
            _no_meta(batch)
        replies: list[Any] | None = await self._single(ring, batch, None, None)
        if replies is not None:
            _no_refusal(self._locate(ring), batch, replies)
        return replies

    # -- owner primitives --

    async def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        """As :meth:`Cluster.gets_ttl`; over text the TTL is not read (None)."""
        if self._text:
            value, token = await self.gets(key)
            return value, token, None
        kb, ring = placed(key)
        request = MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True)
        decode = partial(_value_cas_ttl, self._deserialize, kb)
        miss: tuple[Any, CasToken | None, int | None] = _NO_CAS_TTL
        return _live(await self._single(ring, request, decode, miss))

    async def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        kb, ring = placed(key)
        data, flags = _encoded(self.serde, kb, value)
        if self._text:
            added = Store("add", kb, data, flags, _expire(expire))
            return await self._text_cas(key, added, data, flags)
        request = MetaSet(
            kb, data=data, mode="E", ttl=_expire(expire), client_flags=flags, return_cas=True
        )
        return await self._single(ring, request, _meta_cas, None)

    async def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = await self._home_token(kb, cas)
            if home_cas is None:
                return None
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        token = _cas_token(cas)
        if self._text:
            swapped = Store("cas", kb, data, flags, _expire(expire), token)
            return await self._text_cas(key, swapped, data, flags)
        request = _meta_swap(kb, data, flags, token, expire)
        return await self._single(ring, request, _meta_cas, None)

    async def delete_cas(self, key: Key, cas: CasToken) -> bool:
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = await self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        token = _cas_token(cas)
        if self._text:
            item = await self._single(ring, Get((kb,), cas=True), _first_value, None)
            if item is None or item.cas != token:
                return False
            expired = Store("cas", kb, item.data, item.flags, _EXPIRED, token)
            failed: bool | None = False
            return bool(await self._single(ring, expired, _cas_stored, failed))
        return await self._single(ring, MetaDelete(kb, cas=int(token)), _meta_deleted, False)

    async def _text_cas(self, key: Key, write: Store, data: bytes, flags: int) -> CasToken | None:
        replies = await self.exchange(key, (write, Get((write.key,), cas=True)))
        return None if replies is None else _text_cas_token(write, replies, data, flags)

    async def _store(self, command: StoreCommand, key: Key, value: Any, expire: int) -> bool:
        kb, ring = placed(key)
        data, flags = _encoded(self.serde, kb, value)
        request = Store(command, kb, data, flags, _expire(expire))
        decode = _stored if command in ("append", "prepend") else _written
        return await self._single(ring, request, decode, False)

    # -- server-side stampede tokens (meta mode only; see Cluster.claim) --

    async def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None:
        if self._text:
            return None
        kb, ring = placed(key)
        if self._routes is not None and self._routes.copies(kb, ring) > 1:
            return None  # a replicated key: the lock-based path decides (Cluster.claim)
        batch = _claim_batch(self.serde, kb, recache, placeholder, placeholder_ttl)
        replies = await self.exchange(key, batch)
        return None if replies is None else _claimed(self.serde, kb, replies)

    async def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        """As :meth:`Cluster.cas_stale`: the swap, then ``md I`` of the version it wrote."""
        if self._text:
            return await self.cas(key, value, cas, expire)
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = await self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        swap = _meta_swap(kb, data, flags, _cas_token(cas), expire)
        answer, invalidate = _swapped(kb, await self._single(ring, swap, _identity, None))
        if invalidate is not None:
            await self._single(ring, invalidate, _identity, None)
        return answer

    # -- multi-key writes (pipelined fan-out) --

    async def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        """As :meth:`Cluster.set_many`: the keys that were *not* stored."""
        if isinstance(expire, bool) or not isinstance(expire, int):
            raise ValueError(f"expire must be an integer, not {expire!r}")
        given = {placed(key)[0]: key for key in values}
        encoded = {kb: _encoded(self.serde, kb, values[key]) for kb, key in given.items()}
        failed: list[KeyT] = []
        replicated = self._routes.replicated_keys(given) if self._routes is not None else ()
        for kb in replicated:  # each to all its replicas (one round trip)
            key = given.pop(kb)
            if not await self.set(key, values[key], expire):
                failed.append(key)
        parts = await self._fan_out(_StoreMany(encoded, _expire(expire)), given)
        return failed + [given[kb] for part in parts for kb in part]

    async def delete_many(self, keys: Iterable[Key]) -> None:
        given = {placed(key)[0]: key for key in keys}
        replicated = self._routes.replicated_keys(given) if self._routes is not None else ()
        for kb in replicated:  # each from all its replicas
            await self.delete(given.pop(kb))
        await self._fan_out(_DELETE_MANY, given)

    # -- whole-cluster commands and introspection --

    async def flush_all(self) -> bool:
        every = [*self._nodes.values(), *self.sync._gutter_nodes.values()]  # the gutter's too
        flushed = [await self._on_node(node, FlushAll(), _ok, False) for node in every]
        return all(flushed)

    async def stats(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        for node in self._nodes.values():
            try:
                stats = await self._on_node(node, Stats(), _stats, None)
            except (NodeUnavailableError, CommandNotSupportedError):
                continue
            if stats is not None:
                result[node.name] = stats
        return result

    def strict(self) -> AsyncCluster:
        """As :meth:`Cluster.strict`: raise where the default view degrades (same connections)."""
        if self.options.raise_errors:
            return self
        if self._strict is None:
            view = copy.copy(self)
            view.sync = self.sync.strict()
            view.options = view.sync.options
            self._strict = view
        return self._strict

    def listen(
        self,
        *,
        on_node_event: Callable[[NodeEvent], object] | None = None,
        on_value_refused: Callable[[ValueRefused], object] | None = None,
    ) -> None:
        """As :meth:`Cluster.listen` (the twins share their listeners)."""
        self.sync.listen(on_node_event=on_node_event, on_value_refused=on_value_refused)

    def health(self) -> dict[str, HealthSnapshot]:
        """Every server's health, by node (shared with the sync twin)."""
        return self.sync.health()

    async def close(self) -> None:
        """Close this event loop's connections once idle; node health is kept."""
        loop = asyncio.get_running_loop()
        for links in self._links.values():
            links.close(loop)

    # -- routing and failover: Cluster's rules, with channels --

    async def _single(
        self,
        ring: bytes,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], R] | None,
        failed: R,
    ) -> R:
        if self._routes is not None:
            plan = self._routes.single(ring, request, decode, failed, self.options.raise_errors)
            routed = await self._drive(plan)
            if routed is not UNROUTED:
                return routed  # type: ignore[no-any-return]
        node = self._nodes[self._locate(ring)]
        admission = node.health.open
        if admission is None:
            node, admission = self.sync._failover(ring, node, request)
            if admission is None:
                return self.sync._refused(node, failed)
        return await self._run(node, request, decode, failed, admission)

    # -- replicated keys and the gutter: Cluster's plans (routes.py), with channels --

    async def _drive(self, plan: Plan) -> Any:
        """Run a routing plan with this loop's channels (as Cluster._drive with sockets)."""
        try:
            op = next(plan)
            while True:
                try:
                    result = await self._perform(op)
                except BaseException:
                    plan.close()  # cancelled, or raised mid-write: the plan journals stale copies
                    raise
                op = plan.send(result)
        except StopIteration as done:
            return done.value

    async def _perform(self, op: Run | Parallel | Refuse) -> Any:
        if type(op) is Run:
            if op.loud:
                return await self._run(op.node, op.request, op.decode, FAILED, op.admission)
            return await self._quietly(op.node, op.request, op.decode, op.admission)
        if type(op) is Parallel:
            runs = [self._quietly(node, r, op.decode, a) for node, r, a in op.targets]
            results = await asyncio.gather(*runs, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            return results
        assert type(op) is Refuse
        return self.sync._refused(op.node, op.failed)

    async def _quietly(
        self,
        node: _Node,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], Any] | None,
        admission: Admission,
    ) -> Any:
        try:
            return await self._run(node, request, decode, FAILED, admission)
        except NodeUnavailableError:
            return FAILED

    async def _home_token(self, kb: bytes, cas: CopyToken) -> CasToken | None:
        """As :meth:`Cluster._home_token`: a copy's token becomes the home's, or None."""
        if self._routes is None:
            return None
        token: CasToken | None = await self._drive(self._routes.home_token(kb, cas))
        return token

    async def _replay_all(self) -> None:
        """Servers that missed writes of replicated keys delete them before serving again."""
        routes = self._routes
        if routes is not None:
            for name in routes.journal.dirty:
                await self._drive(routes.admit(self._nodes[name]))

    async def _on_node(
        self, node: _Node, request: Request[Any], decode: Callable[[Any], R], failed: R
    ) -> R:
        admission = node.health.admit()
        if admission is None:
            if self.sync.observer is not None:
                self.sync.observer.skipped(node.name, request)
            return self.sync._refused(node, failed)
        return await self._run(node, request, decode, failed, admission)

    async def _run(
        self,
        node: _Node,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], R] | None,
        failed: R,
        admission: Admission,
    ) -> R:
        batch = request if isinstance(request, tuple) else (request,)
        loop = asyncio.get_running_loop()
        channel = self._links[node].current(loop)
        sent = channel is not None  # from here on the command may reach memcached
        observer = self.sync.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            if channel is None:
                channel = await self._links[node].channel(loop)
                sent = True
            replies = await channel.submit(batch)
            if observer is not None:  # the replies as memcached gave them, before decoding
                single = batch is not request
                observer.request(node.name, request, replies[0] if single else replies, started)
                observer = None
            result: Any = replies if decode is None else decode(replies[0])
        except asyncio.CancelledError as exc:
            if observer is not None:  # a write sent is unknown; counted and timed either way
                observer.failed(node.name, batch, exc, sent, started)
            self._cancelled(node, admission)
            raise
        except BaseException as exc:
            if observer is not None:  # NotSentError: queued, never written, not applied
                reached = sent and not isinstance(exc, NotSentError)
                observer.failed(node.name, batch, exc, reached, started)
            refusal = await self._refusal(node, batch, exc) if sent else None
            if refusal is not None:
                if admission.probe:
                    node.health.released()
                raise refusal from exc
            error = self._judge(node, channel, exc, admission, sent)
            if error is None:
                return failed
            raise error from error.__cause__
        self._done(node)
        return result  # type: ignore[no-any-return]

    async def _refusal(
        self, node: _Node, batch: tuple[Request[Any], ...], exc: BaseException
    ) -> CommandNotSupportedError | None:
        """As :meth:`Cluster._refusal`, probing on new connections of this loop."""
        refusal, refused = _refusal_seen(node.name, batch, exc)
        if refused is None:
            return refusal
        probe = MetaNoop() if isinstance(refused, _META_REQUESTS) else refused
        links = self._links[node]
        if await _answer(links, probe) is not None or await _answer(links, Version()) is None:
            return None
        return _not_supported(node.name, refused, "closed the connection on")

    def _done(self, node: _Node) -> None:
        if node.health.failures:
            node.health.succeeded()
            if self.sync.observer is not None:
                self.sync.observer.server_state(node.name, True)

    def _cancelled(self, node: _Node, admission: Admission) -> None:
        """A cancelled caller: its reply is the channel's to read; a probe gives way."""
        if admission.probe:
            node.health.released()

    def _judge(
        self,
        node: _Node,
        channel: Channel | None,
        exc: BaseException,
        admission: Admission,
        sent: bool,
    ) -> BaseException | None:
        """As :meth:`Cluster._judge`: the server's failures break the channel and count."""
        if isinstance(exc, _NODE_ERRORS):
            if channel is not None:
                channel.fail(exc)  # a reply out of step, or a dead connection
            node.health.failed(exc, admission)
            unknown = sent and not isinstance(exc, NotSentError)
            return self.sync._unavailable(node, exc, unknown=unknown)
        if admission.probe:
            node.health.released()
        return exc

    def _group(
        self,
        given: Mapping[bytes, Key],
        owners: Mapping[bytes, str] | None = None,
        write: bool = False,
    ) -> tuple[dict[_Node, list[bytes]], dict[_Node, list[bytes]], dict[_Node, Admission]]:
        """Keys per server as :meth:`Cluster._group` groups them (with failover)."""
        return self.sync._group(given, owners, write)

    async def _per_server(
        self,
        given: Mapping[bytes, Key],
        start: Callable[[_Node, Channel, list[bytes]], Sequence[asyncio.Future[Any]]],
        finish: Callable[[_Node, list[bytes], list[Any]], object],
        failed: Callable[[_Node, list[bytes], BaseException | None], None],
        described: Callable[[list[bytes]], Request[Any] | tuple[Request[Any], ...]],
        *,
        owners: Mapping[bytes, str] | None = None,
        write: bool = False,
    ) -> None:
        """Run a multi-key command as :meth:`Cluster._fan_out` does, with channels.

        Every server's request is queued first (``start``: no await unless a
        connection must be opened), so they leave in the same loop iteration;
        then each server's replies are awaited and handed to ``finish``.  A
        server that fails, or cannot be used, fails only its own keys
        (``failed``, with the error for the caller or None to degrade).  No
        tasks: awaiting the futures in turn costs no more than the slowest.
        The cluster's observer, if any, gets each server's round trip as
        ``described(kbs)`` with what ``finish`` returned (the replies it reports).
        ``owners`` and ``write`` go to :meth:`_group` (replicated keys, the gutter).
        """
        groups, skipped, granted = self._group(given, owners, write)
        loop = asyncio.get_running_loop()
        observer = self.sync.observer
        began = perf_counter_ns() if observer is not None else 0
        # When each server's last reply came (observed only): the replies are awaited in
        # turn, so the time a server's turn comes includes the servers before it.
        answered: dict[_Node, int] = {}
        started: list[tuple[_Node, Channel, list[bytes], Sequence[asyncio.Future[Any]]]] = []
        pending = list(groups.items())
        try:
            while pending:
                node, kbs = pending[0]
                links = self._links[node]
                channel = links.current(loop)
                sent = channel is not None
                try:
                    if channel is None:
                        channel = await links.channel(loop)
                        sent = True
                    waiters = start(node, channel, kbs)
                    if observer is not None:
                        for waiter in waiters:
                            waiter.add_done_callback(partial(_stamp, answered, node))
                    started.append((node, channel, kbs, waiters))
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    if observer is not None:
                        reached = sent and not isinstance(exc, NotSentError)
                        observer.failed(node.name, described(kbs), exc, reached, began)
                    failed(node, kbs, self._judge(node, channel, exc, granted[node], sent))
                del pending[0]
            while started:
                node, channel, kbs, waiters = started[0]
                try:
                    reported = finish(node, kbs, [await waiter for waiter in waiters])
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    if observer is not None:
                        reached = not isinstance(exc, NotSentError)
                        observer.failed(node.name, described(kbs), exc, reached, began)
                    failed(node, kbs, self._judge(node, channel, exc, granted[node], True))
                else:
                    self._done(node)
                    if observer is not None:  # timed to its own last reply
                        late = perf_counter_ns() - answered.get(node, perf_counter_ns())
                        observer.request(node.name, described(kbs), reported, began + late)
                del started[0]
        except asyncio.CancelledError as exc:
            if observer is not None:  # sent: every started server's; not sent: the pending
                for node, _, kbs, _ in started:
                    observer.failed(node.name, described(kbs), exc, True, began)
                for node, kbs in pending:
                    observer.failed(node.name, described(kbs), exc, False, began)
            for node in {node for node, *_ in started} | {node for node, _ in pending}:
                self._cancelled(node, granted[node])
            raise
        for node, kbs in skipped.items():
            if observer is not None:
                observer.skipped(node.name, described(kbs))
            failed(node, kbs, self.sync._unavailable(node, None))

    async def _fan_out(self, exchange: _Exchange[R], given: Mapping[bytes, Key]) -> list[R]:
        """As :meth:`Cluster._fan_out`: every server's requests, pipelined; a failure is its own."""
        if not given:
            return []
        await self._replay_all()
        results: list[R] = []
        errors: list[BaseException] = []
        routes = self._routes

        def start(node: _Node, channel: Channel, kbs: list[bytes]) -> list[asyncio.Future[Any]]:
            requests = tuple(exchange.requests(kbs))
            if routes is not None and node in routes.gutter_set:
                requests = tuple(clamp(request, routes.gutter_ttl) for request in requests)
            return [channel.submit(requests)]

        def finish(node: _Node, kbs: list[bytes], replies: list[Any]) -> list[Any]:
            results.append(exchange.result(replies[0], kbs))
            return cast(list[Any], replies[0])

        def failed(node: _Node, kbs: list[bytes], error: BaseException | None) -> None:
            if error is None:
                results.append(exchange.failed(kbs))
            else:
                errors.append(error)

        await self._per_server(
            given, start, finish, failed, lambda kbs: tuple(exchange.requests(kbs)), write=True
        )
        if errors:
            raise errors[0]
        return results


def _stamp(answered: dict[_Node, int], node: _Node, _: asyncio.Future[Any]) -> None:
    """Note when ``node``'s reply came (its last one, for several futures)."""
    answered[node] = perf_counter_ns()


async def _answer(links: _Links, request: Request[Any]) -> Any:
    """``request``'s reply on a new connection; None when refused (ERROR or closed) or down."""
    try:
        channel = await open_channel(links.address, links.options)
    except (OSError, ProtocolError):
        return None
    try:
        (reply,) = await channel.submit((request,))
    except (OSError, ProtocolError):
        return None
    finally:
        channel.close()
    if type(reply) is ErrorReply and reply.kind == "ERROR":
        return None
    return reply


# Every server node's channels, shared by every twin of its cluster; weakly keyed:
# they live as long as the node (its cluster).
_all_links: weakref.WeakKeyDictionary[_Node, _Links] = weakref.WeakKeyDictionary()
_all_links_lock = threading.Lock()


def _links_of(node: _Node) -> _Links:
    """The channels of ``node`` (made once: twins made in two threads share them)."""
    with _all_links_lock:
        links = _all_links.get(node)
        if links is None:
            options = node.connect_aside().options  # not connected: the socket options
            links = _all_links[node] = _Links(node.server.address, options)
        return links
