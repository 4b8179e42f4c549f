"""Cluster: memcached's primitives over many servers, with ketama routing and failover.

Routing
    Every key goes to the server the :class:`~.ketama.Continuum` names for the
    key's final bytes, so pylibmc, PHP, twemproxy and spymemcached peers agree
    on where it lives.  The one exception is explicit: a
    :class:`~.keys.Routed` key (not ``bytes``: it cannot be converted by
    accident) is placed by its route's bytes, so every key of a namespace
    shares one server; ``str`` and ``bytes`` keys, braces or not, never route
    differently.  The route travels with the command (:func:`~.keys.placed`)
    to the server choice and the fan-out grouping.
Connections
    One thread-safe pool of :class:`~.transport.Connection` objects per server
    (:class:`~.transport.Pool`).  Every request is
    encoded and every reply parsed by the sans-IO codec of :mod:`.wire`, text
    or meta protocol (``ttl`` is meta's ``mg <key> t``); every command waits
    for its reply, so ``add``/``delete`` answers are real.  :meth:`Cluster.exchange`
    sends any batch of wire requests to a key's server with the same routing,
    failover and outcome handling as the commands here.
    Connections belong to the process that opened them: a forked child (gunicorn
    ``--preload``, Celery prefork, ``multiprocessing``) never uses one it
    inherited.  ``os.register_at_fork`` gives the child new, empty pools at once
    (while it has one thread, so locks a vanished parent thread held are
    replaced too), and a pid check on every checkout catches forks that bypass
    Python's hooks (uWSGI's).  The inherited sockets are closed in the child
    only, which sends nothing: the parent's connections live on.
Replies
    A reply that does not match its request (a key that was not asked for, a
    line out of step, bytes nobody asked for) is a :class:`ProtocolError`: the
    connection is closed and the operation fails as on a server failure, never
    with a wrong value or a stray ``KeyError``.
Failover
    In one place: :meth:`Cluster._pick` decides which server an operation may
    use, :meth:`Cluster._done` and :meth:`Cluster._judge` record its outcome in
    the server's :class:`~.health.NodeHealth` and apply the policy.  Socket
    errors, timeouts and closed connections are server failures; memcached's
    error replies are the caller's errors (``ValueTooLargeError``, ...).
Outcomes
    A failure before anything was sent (no connection) certainly changed
    nothing; once the connection is up, a failure may follow a command that
    memcached applied.  The strict view raises :class:`OutcomeUnknownError`
    for those (a :class:`NodeUnavailableError`), so rewriters can tell "not
    stored" from "unknown" (:mod:`.store`); the default view answers both
    ``False``, as Django's backends do.
Replicas and the gutter
    ``OPTIONS["replicate"]`` keeps keys under a prefix on several servers and
    ``failover="gutter"`` serves a dead server's keys from a spare pool; where
    their commands go is decided by :class:`~.routes.Routes` (plans driven by
    :meth:`Cluster._drive`, and by the async twin), with a journal of the
    writes each server missed, deleted there before it serves again.
Multi-key commands
    Keys are grouped per server and every server's request is written before
    any reply is read (pipelined fan-out), so four servers cost about one round
    trip, not four as in pymemcache's ``HashClient``.  A server that fails only
    loses its own keys.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import random
import selectors
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .exceptions import (
    CommandNotSupportedError,
    ConfigurationError,
    NeedsMetaProtocolError,
    NodeUnavailableError,
    NonNumericValueError,
    OutcomeUnknownError,
    ProtocolError,
    ServerError,
    ValueTooLargeError,
)
from .gutter import clamp
from .health import Admission, HealthSnapshot, NodeEvent, NodeHealth
from .ketama import Continuum
from .keys import Key, KeyT, Routed, placed
from .observe import Observer, Sink, build_observer, command_name
from .options import ClusterOptions
from .registry import Registry
from .replicas import CopyToken, Journal, ReplicaPolicy
from .routes import FAILED, UNROUTED, Parallel, Plan, Refuse, Routes, Run
from .servers import Server, parse_server, parse_servers
from .store import MAX_RELATIVE_EXPIRE, CasToken, Claimed
from .transport import Connection, ConnectionClosedError, Pool, SocketOptions
from .values.envelope import STALE, with_envelopes
from .values.refusals import ValueRefused, is_refused
from .wire import (
    DELETED,
    EXISTS,
    NOT_FOUND,
    NOT_STORED,
    OK,
    STORED,
    TOUCHED,
    Delete,
    ErrorReply,
    FlushAll,
    Get,
    Incr,
    MetaArithmetic,
    MetaDelete,
    MetaGet,
    MetaNoop,
    MetaReply,
    MetaSet,
    Request,
    Stats,
    Store,
    StoreCommand,
    Touch,
    Value,
    Version,
)

if TYPE_CHECKING:
    from .aio import AsyncCluster

__all__ = ["Cluster", "HealthSnapshot", "NodeEvent", "reset_shared_clusters", "shared_cluster"]

logger = logging.getLogger("django_mcpatterns.cluster")

# What a dead, hung or restarted server looks like from here: refused or reset
# connections, timeouts and connections closed mid-reply (all OSError), or a
# reply that does not answer the request.
_NODE_ERRORS = (OSError, ProtocolError)

E = TypeVar("E")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)

_NO_CAS: tuple[None, None] = (None, None)
_NO_CAS_TTL: tuple[None, None, None] = (None, None, None)
_MISSING: Any = object()  # a get's miss, told apart from any value
_MAX_DELTA = 2**64  # incr/decr deltas are unsigned 64-bit (protocol.txt)
_EXPIRED = MAX_RELATIVE_EXPIRE + 1  # an absolute Unix time long past

# Commands a text-only server may not know.  memcached before 1.6 answers a meta
# command ERROR ("a nonexistent command name", protocol.txt); twemproxy closes
# the connection on meta commands, flush_all and stats.
_META_REQUESTS = (MetaGet, MetaSet, MetaDelete, MetaArithmetic, MetaNoop)
_REFUSABLE = (*_META_REQUESTS, FlushAll, Stats)


class _Node:
    """One server: its pool of connections and its health, shared by every thread.

    The pool belongs to the process ``pid``: :meth:`checkout` in any other
    (a forked child) first replaces it with one of that process's own.
    """

    __slots__ = (
        "__weakref__",
        "_idle_timeout",
        "_lock",
        "_make_client",
        "_pool_size",
        "health",
        "name",
        "pid",
        "pool",
        "server",
    )

    def __init__(
        self,
        server: Server,
        health: NodeHealth,
        pool_size: int | None,
        idle_timeout: float,
        make_client: Callable[[], Connection],
    ) -> None:
        self.server = server
        self.name = server.node
        self.health = health
        self._pool_size = pool_size
        self._idle_timeout = idle_timeout
        self._make_client = make_client
        self._open()
        _process_nodes.add(self)

    def _open(self) -> None:
        """Start an empty pool, this process's."""
        lock = threading.Lock()
        self._lock = lock
        # The pool runs on our lock so drop_idle() can close idle clients without
        # racing a checkout.
        self.pool = Pool(
            self._make_client,
            max_size=self._pool_size,
            idle_timeout=self._idle_timeout,
            lock=lock,
        )
        self.pid = os.getpid()

    def connect_aside(self) -> Connection:
        """A new connection outside the pool, for a probe; the caller closes it."""
        return self._make_client()

    def checkout(self) -> Connection:
        """Take a connection of this process's pool; the caller releases or destroys it."""
        if self.pid != _getpid():
            _process_nodes.adopt(self)  # forked without Python's at-fork hooks
        return self.pool.get()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's connections, keep its view of the server.

        Closing a socket here closes the child's descriptor only; nothing is
        sent, so the parent (and its other children) keep their connections.
        """
        inherited = (*self.pool.free, *self.pool.used)
        self._open()
        self.health.after_fork()
        for client in inherited:
            client.close()

    def drop_idle(self) -> None:
        """Close idle connections; busy ones stay with the operations using them.

        A closed connection reconnects on its next use.
        """
        with self._lock:
            for client in self.pool.free:
                client.close()

    def __repr__(self) -> str:
        return f"<node {self.name}>"


class _Listeners(Generic[E]):
    """Callables told of each event, each added once; one that fails is logged, not raised.

    Shared by a cluster and its strict view; adding swaps in a new tuple, so
    telling needs no lock.
    """

    def __init__(self, hook: str) -> None:
        self._hook = hook
        self._lock = threading.Lock()
        self._listeners: tuple[Callable[[E], object], ...] = ()

    def add(self, listener: Callable[[E], object]) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

    def __call__(self, event: E) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("%s handler failed for %s", self._hook, event)


class Cluster:
    """The Store protocol (see :mod:`.store`) on a cluster of memcached servers.

    ``servers`` are ``Server`` objects or specs (``"host:port[:weight]"``,
    unix socket paths).  ``serde`` serialises values (by default the
    :class:`~.serializers.ValueSerde` of ``options``: serializer and signing;
    an item it refuses reads as a miss and is told to the ``on_value_refused``
    listeners), wrapped to read soft-expiry envelopes as plain values
    (:mod:`.envelope`).  ``on_node_event`` receives a
    :class:`~.health.NodeEvent` for each failure and for dead/revived
    transitions; :meth:`listen` adds more listeners.  ``clock`` drives the
    retry timers and ``rng`` the jitter of a dead server's back-off
    (:mod:`.health`).

    Thread-safe; one instance per process is meant to be shared by every
    thread (see :func:`shared_cluster`).
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
        self.servers = _as_servers(servers)
        self.options = options = options or ClusterOptions()
        self._node_listeners: _Listeners[NodeEvent] = _Listeners("on_node_event")
        self._refused_listeners: _Listeners[ValueRefused] = _Listeners("on_value_refused")
        self.serde = with_envelopes(
            serde if serde is not None else options.serde_options.build(self._refused_listeners)
        )
        self.listen(on_node_event=on_node_event)
        weighted = any(s.weight != 1 for s in self.servers)
        self.ring = Continuum(
            [s.node for s in self.servers],
            weights=[s.weight for s in self.servers] if weighted else None,
            variant=options.ketama,
            names=[s.name for s in self.servers],
        )
        socket_options = SocketOptions(
            connect_timeout=options.connect_timeout,
            timeout=options.timeout,
            **options.client_options,
        )
        self._nodes: dict[str, _Node] = {}
        for server in self.servers:
            self._nodes[server.node] = self._node(server, socket_options, clock, rng)
        # With one server every key maps to it: skip the hash on the hot path.
        only = self.servers[0].node
        self._locate: Callable[[bytes], str] = (
            _remembered_routes(self.ring.get_node) if len(self.servers) > 1 else lambda ring: only
        )
        self._remap = options.failover == "remap"
        self._text = options.protocol == "text"
        self._deserialize = self.serde.deserialize
        self._fetch = _Fetch(self.serde)
        self._fetch_cas = _Fetch(self.serde, cas=True)
        self._fetch_envelopes = _Fetch(self.serde, envelopes=True)
        self._strict: Cluster | None = None
        # None unless OPTIONS["instrumentation"] asks (or a sink is added): one check per request.
        self.observer: Observer | None = build_observer(
            options.instrumentation_name,
            self.servers,
            options.instrumentation,
            registry=options.prometheus_registry,
            tracer_provider=options.tracer_provider,
            trace_keys=options.trace_keys,
        )
        self._refused_listeners.add(self._observe_refused)
        # Replicated keys and the gutter pool (replicas.py, gutter.py): off unless configured.
        self._gutter_nodes: dict[str, _Node] = {}
        self._routes: Routes | None = None
        policy = ReplicaPolicy.build(options.replicate, options.replicate_scope)
        if policy is not None or options.failover == "gutter":
            gutter_ring = self._build_gutter(socket_options, clock, rng)
            self._routes = Routes(
                ring=self.ring,
                nodes=self._nodes,
                locate=self._locate,
                policy=policy,
                gutter_ring=gutter_ring,
                gutter_nodes=self._gutter_nodes,
                gutter_ttl=options.gutter_ttl,
                rng=rng,
            )
            _journals.add(self._routes.journal)

    def __repr__(self) -> str:
        return f"<Cluster {', '.join(self._nodes)} ketama={self.options.ketama}>"

    # -- single-key commands --

    def get(self, key: Key, default: Any = None) -> Any:
        kb, ring = placed(key)
        value = self._single(ring, Get((kb,)), self._value, _MISSING)
        if value is _MISSING or value is STALE:
            return default  # past its soft expiry: a plain miss, left for get_or_compute
        return default if is_refused(value) else value

    def gets(self, key: Key) -> tuple[Any, CasToken | None]:
        kb, ring = placed(key)
        miss: tuple[Any, CasToken | None] = _NO_CAS
        found = self._gets(kb, ring, self._value_cas, miss)
        if found[0] is STALE or is_refused(found[0]):
            return _NO_CAS  # past its soft expiry, or refused (left in place): a miss
        return found

    def set(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self._store("set", key, value, expire)

    def add(self, key: Key, value: Any, expire: int = 0) -> bool:
        return self._store("add", key, value, expire)

    def append(self, key: Key, value: bytes) -> bool:
        return self._store("append", key, _raw(value), 0)

    def prepend(self, key: Key, value: bytes) -> bool:
        return self._store("prepend", key, _raw(value), 0)

    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        request = Store("cas", kb, data, flags, _expire(expire), _cas_token(cas))
        failed: bool | None = False
        return self._single(ring, request, _cas_stored, failed)

    def incr(self, key: Key, delta: int = 1) -> int | None:
        kb, ring = placed(key)
        value: int | None = self._single(ring, Incr(kb, _delta(delta)), _count, None)
        return value

    def decr(self, key: Key, delta: int = 1) -> int | None:
        kb, ring = placed(key)
        value: int | None = self._single(ring, Incr(kb, _delta(delta), decr=True), _count, None)
        return value

    def delete(self, key: Key) -> bool:
        kb, ring = placed(key)
        return self._single(ring, Delete(kb), _deleted, False)

    def touch(self, key: Key, expire: int = 0) -> bool:
        kb, ring = placed(key)
        return self._single(ring, Touch(kb, _expire(expire)), _touched, False)

    def bump(self, key: Key) -> bool:
        """Refresh the item's place in the LRU without reading it or changing its TTL.

        Return whether it was there.  Meta: ``mg <key>`` with no flags ("HD" or
        "EN", no value sent back).  Text: memcached's "touching keys with add"
        trick: an ``add`` that finds the item moves it to the head of the LRU
        and answers NOT_STORED; on a miss it stores an item already expired
        (exptime in 1970), so nothing appears.
        """
        kb, ring = placed(key)
        if self._text:
            probe = Store("add", kb, b"", 0, _EXPIRED)
            return self._single(ring, probe, _bumped_text, False)
        return self._single(ring, MetaGet(kb), _bumped_meta, False)

    def ttl(self, key: Key) -> int | None:
        """Return the seconds the item has left (-1: never expires), None when it is missing.

        Meta protocol only: in text mode (twemproxy, mcrouter) raise
        :class:`NeedsMetaProtocolError` before any I/O; rewriters then keep
        the expiry their items record (:mod:`.append`).
        """
        kb, ring = placed(key)
        if self._text:
            raise NeedsMetaProtocolError(
                "ttl needs memcached's meta protocol (mg <key> t), and "
                "OPTIONS['protocol'] is 'text'",
                option="protocol",
            )
        # Meta get with only the t flag (memcached 1.6+): "HD t<seconds>", or "EN".
        return self._single(ring, MetaGet(kb, ttl=True), _ttl, None)

    def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> list[Any] | None:
        """Send wire requests (:mod:`.wire`) to ``key``'s server in one write; return the replies.

        Routing, failover and outcomes are those of every command: None when
        the server cannot be used and the view degrades (the strict view
        raises :class:`NodeUnavailableError`, or :class:`OutcomeUnknownError`
        once the requests may have left).  Error replies are returned as
        :class:`~.wire.ErrorReply`, for the caller to judge.
        """
        _, ring = placed(key)
        batch = tuple(requests)
        if self._text:
            _no_meta(batch)
        replies: list[Any] | None = self._single(ring, batch, None, None)
        if replies is not None:
            _no_refusal(self._locate(ring), batch, replies)
        return replies

    # -- owner primitives (store.py): one meta command, or text commands in one write --

    def gets_ttl(self, key: Key) -> tuple[Any, CasToken | None, int | None]:
        """Return ``(value, cas_token, ttl)``; over text the TTL is not read (None)."""
        if self._text:
            value, token = self.gets(key)
            return value, token, None
        kb, ring = placed(key)
        request = MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True)
        decode = partial(_value_cas_ttl, self._deserialize, kb)
        miss: tuple[Any, CasToken | None, int | None] = _NO_CAS_TTL
        return _live(self._single(ring, request, decode, miss))

    def add_cas(self, key: Key, value: Any, expire: int = 0) -> CasToken | None:
        """``add``, returning the new item's cas token (None: not stored)."""
        kb, ring = placed(key)
        data, flags = _encoded(self.serde, kb, value)
        if self._text:
            added = Store("add", kb, data, flags, _expire(expire))
            return self._text_cas(key, added, data, flags)
        request = MetaSet(
            kb, data=data, mode="E", ttl=_expire(expire), client_flags=flags, return_cas=True
        )
        return self._single(ring, request, _meta_cas, None)

    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> CasToken | None:
        """``cas``, returning the new item's cas token (None: not stored)."""
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = self._home_token(kb, cas)
            if home_cas is None:
                return None
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        token = _cas_token(cas)
        if self._text:
            swapped = Store("cas", kb, data, flags, _expire(expire), token)
            return self._text_cas(key, swapped, data, flags)
        request = _meta_swap(kb, data, flags, token, expire)
        return self._single(ring, request, _meta_cas, None)

    def delete_cas(self, key: Key, cas: CasToken) -> bool:
        """Delete the item only while its cas token is ``cas``."""
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        token = _cas_token(cas)
        if self._text:
            # No cas on a text delete: read the item's bytes, then expire that version.
            item = self._single(ring, Get((kb,), cas=True), _first_value, None)
            if item is None or item.cas != token:
                return False
            expired = Store("cas", kb, item.data, item.flags, _EXPIRED, token)
            failed: bool | None = False
            return bool(self._single(ring, expired, _cas_stored, failed))
        return self._single(ring, MetaDelete(kb, cas=int(token)), _meta_deleted, False)

    def _text_cas(self, key: Key, write: Store, data: bytes, flags: int) -> CasToken | None:
        """Send a text storage command and a ``gets`` in one write: the stored item's cas."""
        replies = self.exchange(key, (write, Get((write.key,), cas=True)))
        return None if replies is None else _text_cas_token(write, replies, data, flags)

    def _store(self, command: StoreCommand, key: Key, value: Any, expire: int) -> bool:
        kb, ring = placed(key)
        data, flags = _encoded(self.serde, kb, value)
        decode = _stored if command in ("append", "prepend") else _written
        return self._single(ring, Store(command, kb, data, flags, _expire(expire)), decode, False)

    def _value(self, reply: list[Value] | ErrorReply) -> Any:
        if type(reply) is not list:
            raise _reply_error(reply)
        if not reply:
            return _MISSING
        item = reply[0]
        return self._deserialize(item.key, item.data, item.flags)

    def _value_cas(self, reply: list[Value] | ErrorReply) -> tuple[Any, CasToken | None]:
        if type(reply) is not list:
            raise _reply_error(reply)
        if not reply:
            return _NO_CAS
        item = reply[0]
        return self._deserialize(item.key, item.data, item.flags), item.cas

    # -- the soft-expiry envelope's explicit read path (see Store.gets_envelope) --

    def gets_envelope(self, key: Key) -> tuple[Any, CasToken | None]:
        kb, ring = placed(key)
        miss: tuple[Any, CasToken | None] = _NO_CAS
        found = self._gets(kb, ring, self._envelope_cas, miss)
        return _NO_CAS if is_refused(found[0]) else found

    def _gets(self, kb: bytes, ring: bytes, decode: Callable[[Any], R], miss: R) -> R:
        """A caller's ``gets``: spread over a replicated key's replicas (routes.py)."""
        request = Get((kb,), cas=True)
        routes = self._routes
        if routes is not None and routes.copies(kb, ring) > 1:
            strict = self.options.raise_errors
            return self._drive(routes.spread_tokens(kb, request, decode, miss, strict))  # type: ignore[no-any-return]
        return self._single(ring, request, decode, miss)

    def _home_token(self, kb: bytes, cas: CopyToken) -> CasToken | None:
        """The home's cas token while it holds the item a copy's token came with, else None."""
        if self._routes is None:
            return None
        token: CasToken | None = self._drive(self._routes.home_token(kb, cas))
        return token

    def get_many_envelopes(self, keys: Iterable[Key]) -> dict[Key, Any]:
        given = {placed(key)[0]: key for key in keys}
        spread = self._routes.spread(given) if self._routes is not None else None
        parts = self._fan_out(self._fetch_envelopes, given, spread)
        return self._hits(parts, given, lambda value: value)

    def _envelope_cas(self, reply: list[Value] | ErrorReply) -> tuple[Any, CasToken | None]:
        if type(reply) is not list:
            raise _reply_error(reply)
        if not reply:
            return _NO_CAS
        item = reply[0]
        return self.serde.deserialize_envelope(item.key, item.data, item.flags), item.cas

    # -- server-side stampede tokens (tokens.TokenStore; meta mode only) --

    def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Claimed | None:
        """``mg v c f t R<recache>`` and, given a placeholder, its add: one write (tokens.py).

        None (the lock-based path decides) in text mode and for a replicated
        key: its tokens would be one replica's, and its reads are spread.
        """
        if self._text:
            return None
        kb, ring = placed(key)
        if self._routes is not None and self._routes.copies(kb, ring) > 1:
            return None
        batch = _claim_batch(self.serde, kb, recache, placeholder, placeholder_ttl)
        replies = self.exchange(key, batch)
        if replies is None:
            return None  # unreachable (degrading view): the lock-based path decides
        return _claimed(self.serde, kb, replies)

    def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> bool | None:
        """``cas``; in meta mode then ``md <key> I`` of that very version, so one reader gets ``W``.

        The invalidation names the cas the swap handed back: sent blindly after
        a swap that failed, it would mark whatever the key holds by then (a
        filler's placeholder, voiding its lease and wedging the key).
        """
        if self._text:
            return self.cas(key, value, cas, expire)
        kb, ring = placed(key)
        if type(cas) is CopyToken:  # read from a copy: the home's, if it holds that item
            home_cas = self._home_token(kb, cas)
            if home_cas is None:
                return False
            cas = home_cas
        data, flags = _encoded(self.serde, kb, value)
        swap = _meta_swap(kb, data, flags, _cas_token(cas), expire)
        answer, invalidate = _swapped(kb, self._single(ring, swap, _identity, None))
        if invalidate is not None:
            self._single(ring, invalidate, _identity, None)
        return answer

    # -- multi-key commands (pipelined fan-out) --

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Return the hits only, keyed by the keys as given."""
        given = {placed(key)[0]: key for key in keys}
        spread = self._routes.spread(given) if self._routes is not None else None
        parts = self._fan_out(self._fetch, given, spread)
        return self._hits(parts, given, lambda value: value)

    def gets_many(self, keys: Iterable[Key]) -> dict[Key, tuple[Any, CasToken]]:
        given = {placed(key)[0]: key for key in keys}
        return self._hits(self._fan_out(self._fetch_cas, given), given, lambda pair: pair[0])

    def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> list[KeyT]:
        """Store every value; return the keys that were *not* stored.

        A key fails alone: a value over the item size limit, or a server that
        cannot be used, fails only its own keys.
        """
        if isinstance(expire, bool) or not isinstance(expire, int):
            raise ValueError(f"expire must be an integer, not {expire!r}")
        given = {placed(key)[0]: key for key in values}
        # Every value is encoded before anything is sent: one that cannot be raises alone.
        encoded = {kb: _encoded(self.serde, kb, values[key]) for kb, key in given.items()}
        failed: list[KeyT] = []
        replicated = self._routes.replicated_keys(given) if self._routes is not None else ()
        for kb in replicated:  # each to all its replicas (one round trip)
            key = given.pop(kb)
            if not self.set(key, values[key], expire):
                failed.append(key)
        parts = self._fan_out(_StoreMany(encoded, _expire(expire)), given)
        return failed + [given[kb] for part in parts for kb in part]

    def delete_many(self, keys: Iterable[Key]) -> None:
        given = {placed(key)[0]: key for key in keys}
        replicated = self._routes.replicated_keys(given) if self._routes is not None else ()
        for kb in replicated:  # each from all its replicas
            self.delete(given.pop(kb))
        self._fan_out(_DELETE_MANY, given)

    # -- whole-cluster commands and introspection --

    def flush_all(self) -> bool:
        """Flush every server (the gutter pool's too); return whether all of them did."""
        every = [*self._nodes.values(), *self._gutter_nodes.values()]
        flushed = [self._on_node(node, FlushAll(), _ok, False) for node in every]
        return all(flushed)

    def stats(self, *, gutter: bool = False) -> dict[str, dict[str, Any]]:
        """Return memcached's ``stats`` of every server that answers, by node.

        ``gutter``: of the gutter pool's servers instead.
        """
        result: dict[str, dict[str, Any]] = {}
        for node in (self._gutter_nodes if gutter else self._nodes).values():
            try:
                stats = self._on_node(node, Stats(), _stats, None)
            except (NodeUnavailableError, CommandNotSupportedError):
                continue  # down, or a proxy that does not pass stats (twemproxy)
            if stats is not None:
                result[node.name] = stats
        return result

    def strict(self) -> Cluster:
        """Return this cluster raising :class:`NodeUnavailableError` where it would degrade.

        The view shares the servers, connection pools and node health; only how
        an unreachable server is reported differs.  Locks use it to tell "held
        by someone else" from "server unreachable" while ordinary cache traffic
        keeps degrading to misses (:mod:`.locks`).
        """
        if self.options.raise_errors:
            return self
        if self._strict is None:
            view = copy.copy(self)
            view.options = dataclasses.replace(self.options, raise_errors=True)
            self._strict = view
        return self._strict

    @property
    def aio(self) -> AsyncCluster:
        """This cluster's asyncio twin (:class:`~.aio.AsyncCluster`), made once.

        It shares the ring, options, serde, listeners and every server's node
        health (one view of a server per process, whichever API saw it fail),
        and has connections of its own: one per server and event loop.
        """
        twin: AsyncCluster | None = self.__dict__.get("_aio")
        if twin is None or twin.sync is not self:  # none yet, or the one copied into strict()
            from .aio import AsyncCluster

            twin = self.__dict__["_aio"] = AsyncCluster.twin_of(self)
        return twin

    def listen(
        self,
        *,
        on_node_event: Callable[[NodeEvent], object] | None = None,
        on_value_refused: Callable[[ValueRefused], object] | None = None,
    ) -> None:
        """Also tell these of node events and of items the default serde refuses.

        Listeners add up, each once however often it is given (compared with
        ``==``: pass the same function, not a new ``partial`` each time).
        """
        if on_node_event is not None:
            self._node_listeners.add(on_node_event)
        if on_value_refused is not None:
            self._refused_listeners.add(on_value_refused)

    def observe(self, sink: Sink) -> Observer:
        """Also send every request, pattern call and event to ``sink`` (:mod:`.observe`).

        The debug toolbar's panel does this; without instrumentation it gives
        the cluster its observer (and the strict view the same one).
        """
        if self.observer is None:
            self.observer = Observer(self.options.instrumentation_name, list(self._nodes))
            if self._strict is not None and self._strict is not self:
                self._strict.observer = self.observer
        self.observer.add(sink)
        return self.observer

    def _observe_refused(self, event: ValueRefused) -> None:
        if self.observer is not None:
            self.observer.event("value_refused")

    def health(self) -> dict[str, HealthSnapshot]:
        """Return every server's health, by node."""
        return {name: node.health.snapshot() for name, node in self._nodes.items()}

    def close(self) -> None:
        """Close idle connections.  Node health and busy connections are kept."""
        for node in self._nodes.values():
            node.drop_idle()

    # -- routing and failover: the one place --

    def _hits(
        self, parts: list[dict[bytes, Any]], given: Mapping[bytes, Key], value: Callable[[Any], Any]
    ) -> dict[Key, Any]:
        """The fetched items by the keys as given; refused ones are misses, left in place.

        An item the serde refused may be another client's (PHP, Java, pylibmc on
        the same ring): a read never deletes it (serializers.py).
        """
        hits: dict[Key, Any] = {}
        for part in parts:
            for kb, found in part.items():
                found_value = value(found)
                # Past its soft expiry (left for get_or_compute), or refused: a miss.
                if found_value is not STALE and not is_refused(found_value):
                    hits[given[kb]] = found
        return hits

    def _single(
        self,
        ring: bytes,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], R] | None,
        failed: R,
    ) -> R:
        """Send ``request`` to the server the ring names for ``ring`` (a key's route: see
        :func:`~.keys.placed`) and decode its reply (None: the replies to a batch as they
        are); lock-free while the server is healthy."""
        if self._routes is not None:
            plan = self._routes.single(ring, request, decode, failed, self.options.raise_errors)
            routed = self._drive(plan)
            if routed is not UNROUTED:
                return routed  # type: ignore[no-any-return]
        node = self._nodes[self._locate(ring)]
        admission = node.health.open
        if admission is None:
            node, admission = self._failover(ring, node, request)
            if admission is None:
                return self._refused(node, failed)
        return self._run(node, request, decode, failed, admission)

    def _failover(
        self, ring: bytes, node: _Node, request: Request[Any] | tuple[Request[Any], ...]
    ) -> tuple[_Node, Admission | None]:
        """Where a single-key command goes while ``node`` (the ring's) is not open.

        The picked server and its admission, for both drivers; ``(node, None)``:
        no server may be asked now (the observer is told it was skipped).
        """
        picked = self._pick(ring, node, {})
        if picked is None:
            if self.observer is not None:
                self.observer.skipped(node.name, request)
            return node, None
        return picked

    def _on_node(
        self, node: _Node, request: Request[Any], decode: Callable[[Any], R], failed: R
    ) -> R:
        """Send ``request`` to one given server (whole-cluster commands)."""
        admission = node.health.admit()
        if admission is None:
            if self.observer is not None:
                self.observer.skipped(node.name, request)
            return self._refused(node, failed)
        return self._run(node, request, decode, failed, admission)

    # -- replicated keys and the gutter pool (replicas.py, gutter.py) --

    def _node(
        self,
        server: Server,
        socket_options: SocketOptions,
        clock: Callable[[], float],
        rng: Callable[[], float],
    ) -> _Node:
        """One server's pool and health (a ring server's or a gutter server's)."""
        options = self.options
        health = NodeHealth(
            server.node,
            retry_attempts=options.retry_attempts,
            retry_timeout=options.retry_timeout,
            dead_timeout=options.dead_timeout,
            clock=clock,
            report=self._report,
            rng=rng,
        )
        connect = _connection_factory(server, socket_options)
        return _Node(server, health, options.max_pool_size, options.pool_idle_timeout, connect)

    def _build_gutter(
        self, socket_options: SocketOptions, clock: Callable[[], float], rng: Callable[[], float]
    ) -> Continuum | None:
        """The gutter pool's servers (with their own health) and its ketama ring, if any."""
        options = self.options
        if not options.gutter:
            return None
        try:
            servers = _as_servers(list(options.gutter))
        except ConfigurationError as exc:
            raise ConfigurationError(f"OPTIONS['gutter']: {exc}", option="gutter") from exc
        for server in servers:
            self._gutter_nodes[server.node] = self._node(server, socket_options, clock, rng)
        weighted = any(s.weight != 1 for s in servers)
        return Continuum(
            [s.node for s in servers],
            weights=[s.weight for s in servers] if weighted else None,
            variant=options.ketama,
        )

    def replicas(self, key: Key) -> list[str]:
        """Return the servers that hold ``key``: its home first, then its copies."""
        kb, ring = placed(key)
        copies = self._routes.copies(kb, ring) if self._routes is not None else 1
        return self.ring.get_nodes(ring, copies)

    def gutter_health(self) -> dict[str, HealthSnapshot]:
        """Return every gutter server's health, by node (empty without the gutter policy)."""
        return {name: node.health.snapshot() for name, node in self._gutter_nodes.items()}

    def journal(self) -> dict[str, int]:
        """Return how many keys each server still has to delete before it serves (replicas.py)."""
        return self._routes.journal.pending() if self._routes is not None else {}

    def _drive(self, plan: Plan) -> Any:
        """Run a routing plan (routes.py) with this view's sockets."""
        try:
            op = next(plan)
            while True:
                try:
                    result = self._perform(op)
                except BaseException:
                    plan.close()  # cancelled, or raised mid-write: the plan journals stale copies
                    raise
                op = plan.send(result)
        except StopIteration as done:
            return done.value

    def _perform(self, op: Run | Parallel | Refuse) -> Any:
        if type(op) is Run:
            if op.loud:
                return self._run(op.node, op.request, op.decode, FAILED, op.admission)
            return self._quietly(op.node, op.request, op.decode, op.admission)
        if type(op) is Parallel:
            return self._parallel(op.targets, op.decode)
        assert type(op) is Refuse
        return self._refused(op.node, op.failed)

    def _quietly(
        self,
        node: _Node,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], Any] | None,
        admission: Admission,
    ) -> Any:
        """``_run`` that answers ``FAILED`` for a server failure, in the strict view too."""
        try:
            return self._run(node, request, decode, FAILED, admission)
        except NodeUnavailableError:
            return FAILED

    def _parallel(
        self,
        targets: list[tuple[_Node, Request[Any], Admission]],
        decode: Callable[[Any], Any] | None,
    ) -> list[Any]:
        """Send each target its request, then read every reply: one round trip for all.

        A server failure is that target's ``FAILED`` (recorded in its health);
        an error for the caller is raised once every reply has been read.
        """
        results: list[Any] = [FAILED] * len(targets)
        errors: list[BaseException] = []
        pending: list[tuple[int, _Node, Connection, Request[Any], Admission]] = []

        def settle(
            node: _Node,
            client: Connection | None,
            exc: BaseException,
            admission: Admission,
            sent: bool,
        ) -> None:
            error = self._judge(node, client, exc, admission, sent)
            if error is not None and not isinstance(exc, _NODE_ERRORS):
                errors.append(error)

        observer = self.observer
        began = perf_counter_ns() if observer is not None else 0
        for i, (node, request, admission) in enumerate(targets):
            client = None
            sent = False
            try:
                client = node.checkout()
                client.connect()
                sent = True
                client.send(request.encode())
            except BaseException as exc:
                if observer is not None:
                    observer.failed(node.name, request, exc, sent, began)
                settle(node, client, exc, admission, sent)
            else:
                pending.append((i, node, client, request, admission))
        answering = _answering([client for _, _, client, _, _ in pending], self.options.timeout)
        for i, node, client, request, admission in pending:
            replied = False
            try:
                if client not in answering:  # silent for a whole timeout, as the others ran
                    raise TimeoutError("timed out")
                (reply,) = client.receive((request,))
                replied = True
                if observer is not None:  # the reply as memcached gave it, before decoding
                    observer.request(node.name, request, reply, began)
                result = reply if decode is None else decode(reply)
            except BaseException as exc:
                if observer is not None and not replied:
                    observer.failed(node.name, request, exc, True, began)
                settle(node, client, exc, admission, True)
            else:
                self._done(node, client)
                results[i] = result
        if errors:
            raise errors[0]
        return results

    def _pick(
        self, ring: bytes, primary: _Node, admitted: dict[_Node, Admission | None]
    ) -> tuple[_Node, Admission] | None:
        """Choose the server for a key whose own server is failing, or None.

        ``"miss"``: its own server once the wait is over (this operation probes
        it).  ``"remap"``: the first server in ring order from the key that may
        be contacted.  ``admitted`` remembers each server's admission for the
        whole operation, so one multi-key call probes a server only once.
        """
        names = self.ring.get_nodes(ring, len(self._nodes)) if self._remap else (primary.name,)
        for name in names:
            node = self._nodes[name]
            if node not in admitted:
                admitted[node] = node.health.admit()
            admission = admitted[node]
            if admission is not None:
                return node, admission
        return None

    def _run(
        self,
        node: _Node,
        request: Request[Any] | tuple[Request[Any], ...],
        decode: Callable[[Any], R] | None,
        failed: R,
        admission: Admission,
    ) -> R:
        client = None
        sent = False  # from here on the command may have reached memcached
        observer = self.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            client = node.checkout()
            client.connect()
            sent = True
            if decode is None:
                reply: Any = client.exchange(request)  # type: ignore[arg-type]
                result: Any = reply
            else:
                reply = client.request(request)  # type: ignore[arg-type]
                if observer is not None:  # the reply as memcached gave it, before decoding
                    observer.request(node.name, request, reply, started)
                    observer = None
                result = decode(reply)
        except BaseException as exc:
            if observer is not None:
                observer.failed(node.name, request, exc, sent, started)
            refusal = self._refusal(node, request, exc) if sent else None
            if refusal is not None:  # a setting, not a failing server: health untouched
                node.pool.destroy(client)  # type: ignore[arg-type]  # sent: checked out
                if admission.probe:
                    node.health.released()
                raise refusal from exc
            error = self._judge(node, client, exc, admission, sent)
            if error is None:
                return failed
            raise error from error.__cause__  # _translate/_unavailable chained it to exc
        if observer is not None:
            observer.request(node.name, request, reply, started)
        self._done(node, client)
        return result  # type: ignore[no-any-return]

    def _refusal(
        self,
        node: _Node,
        request: Request[Any] | tuple[Request[Any], ...],
        exc: BaseException,
    ) -> CommandNotSupportedError | None:
        """The error for a command the server does not know, or None: it is failing.

        memcached before 1.6 answers a meta command ``ERROR``: certain.
        twemproxy closes the connection instead, which a failing server does
        too, so the server is asked again on fresh connections: the same
        refusal of the command (``mn`` for a meta one) while ``version`` is
        answered means the server is up and does not know the command.
        """
        batch = request if isinstance(request, tuple) else (request,)
        refusal, refused = _refusal_seen(node.name, batch, exc)
        if refused is None:
            return refusal
        probe = MetaNoop() if isinstance(refused, _META_REQUESTS) else refused
        if _answer(node, probe) is not None or _answer(node, Version()) is None:
            return None
        return _not_supported(node.name, refused, "closed the connection on")

    def _done(self, node: _Node, client: Connection) -> None:
        """Return a connection after a complete exchange and record the server's answer."""
        node.pool.release(client)
        if node.health.failures:
            node.health.succeeded()
            if self.observer is not None:
                self.observer.server_state(node.name, True)

    def _judge(
        self,
        node: _Node,
        client: Connection | None,
        exc: BaseException,
        admission: Admission,
        sent: bool = False,
    ) -> BaseException | None:
        """Settle an operation that raised: record what it says about the server.

        Return the exception for the caller, or None when the failover policy
        turns the operation into a miss or a failed write.  ``sent``: the
        command may have left, so its outcome is unknown.
        """
        if client is not None:
            node.pool.destroy(client)  # its connection may be mid-reply: never reuse it
        if isinstance(exc, _NODE_ERRORS):
            node.health.failed(exc, admission)
            node.drop_idle()  # pooled siblings share the dead server's fate
            return self._unavailable(node, exc, unknown=sent)
        if admission.probe:
            node.health.released()
        if client is None and isinstance(exc, RuntimeError):
            return self._unavailable(node, exc)  # ObjectPool refused: max_pool_size reached
        return exc

    def _unavailable(
        self, node: _Node, exc: BaseException | None, *, unknown: bool = False
    ) -> NodeUnavailableError | None:
        if not self.options.raise_errors:
            return None
        if exc is None:
            snapshot = node.health.snapshot()
            detail = f"{snapshot.state}, next try in {snapshot.retry_in:.1f}s"
        else:
            detail = f"{type(exc).__name__}: {exc}"
        kind: type[NodeUnavailableError] = NodeUnavailableError
        outcome = ""
        if isinstance(exc, ProtocolError) or unknown:
            kind = ProtocolError if isinstance(exc, ProtocolError) else OutcomeUnknownError
            outcome = "; the command was sent: it may have been applied"
        error = kind(
            f"memcached server {node.name} is unavailable ({detail}){outcome}", node=node.name
        )
        error.__cause__ = exc
        return error

    def _refused(self, node: _Node, failed: R) -> R:
        """Fail fast: the server is in its retry or dead wait."""
        error = self._unavailable(node, None)
        if error is not None:
            raise error
        return failed

    def _report(self, event: NodeEvent) -> None:
        if event.kind == "dead":
            logger.warning("memcached server %s is dead: %s", event.node, event.error)
        elif event.kind == "revived":
            logger.info("memcached server %s is back", event.node)
        else:
            logger.debug("memcached server %s failed: %r", event.node, event.error)
        observer = self.observer
        if observer is not None:
            observer.server_state(event.node, event.kind == "revived")
            if event.kind != "failure":
                observer.event(f"node_{event.kind}")
        self._node_listeners(event)

    def _group(
        self,
        given: Mapping[bytes, Key],
        owners: Mapping[bytes, str] | None = None,
        write: bool = False,
    ) -> tuple[dict[_Node, list[bytes]], dict[_Node, list[bytes]], dict[_Node, Admission]]:
        """Keys per server, with failover: ``(groups, skipped, admissions)``.

        Both drivers group this way (AsyncCluster too): keys are grouped by
        their server first, so health is read once per server, not per key;
        a failing server's keys each go where the policy says (``_pick``,
        then the gutter for a ``write`` or a read), or are ``skipped``.
        """
        routes = self._routes
        gutter = (
            routes is not None and routes.gutter_ring is not None and not self.options.raise_errors
        )
        groups: dict[_Node, list[bytes]] = defaultdict(list)
        skipped: dict[_Node, list[bytes]] = defaultdict(list)
        granted: dict[_Node, Admission] = {}  # one admission per server contacted
        admitted: dict[_Node, Admission | None] = {}  # what failing servers said (_pick)
        owned: dict[str, list[bytes]] = defaultdict(list)
        locate = self._locate
        for kb, key in given.items():
            owned[locate(key.route if type(key) is Routed else kb)].append(kb)
        if owners:  # replicated keys: the replica chosen for this read instead
            owned = _reassigned(owned, owners)
        for name, kbs in owned.items():
            node = self._nodes[name]
            admission = granted.get(node) or node.health.open
            if admission is not None:
                granted.setdefault(node, admission)
                groups[node].extend(kbs)
                continue
            for kb in kbs:  # a failing server: each key goes where the policy says
                key = given[kb]
                picked = self._pick(key.route if type(key) is Routed else kb, node, admitted)
                if picked is None and gutter and type(key) is not Routed:
                    picked = routes.gutter_pick(node, kb, admitted, write)  # type: ignore[union-attr]
                if picked is None:
                    skipped[node].append(kb)
                    continue
                other, admission = picked
                granted.setdefault(other, admission)
                groups[other].append(kb)
        return groups, skipped, granted

    def _fan_out(
        self,
        exchange: _Exchange[R],
        given: Mapping[bytes, Key],
        owners: Mapping[bytes, str] | None = None,
    ) -> list[R]:
        """Run a multi-key command: group keys per server, send every request, read every reply.

        Errors for the caller are raised only once every server's reply has
        been read, so no connection goes back to the pool mid-reply.
        """
        routes = self._routes
        if routes is not None and routes.journal.dirty:
            for name in routes.journal.dirty:  # servers that missed writes delete them first
                self._drive(routes.admit(self._nodes[name]))
        gutter = (
            routes is not None and routes.gutter_ring is not None and not self.options.raise_errors
        )
        groups, skipped, granted = self._group(given, owners, not isinstance(exchange, _Fetch))

        results: list[R] = []
        errors: list[BaseException] = []
        lost: set[str] = set()  # servers that failed this call (their spread keys are reread)

        def settle(
            node: _Node, client: Connection | None, exc: BaseException, kbs: list[bytes], sent: bool
        ) -> None:
            error = self._judge(node, client, exc, granted[node], sent)
            if error is None:
                results.append(exchange.failed(kbs))
                lost.add(node.name)
            else:
                errors.append(error)

        observer = self.observer
        began: dict[_Node, int] = {}  # when each server's round trip started (observed only)
        pending: list[tuple[_Node, Connection, list[bytes], Sequence[Request[Any]]]] = []
        for node, kbs in groups.items():  # 1. write every server's request...
            client = None
            sent = False
            if observer is not None:
                began[node] = perf_counter_ns()
            try:
                client = node.checkout()
                client.connect()
                sent = True
                requests = exchange.requests(kbs)
                if gutter and node in self._routes.gutter_set:  # type: ignore[union-attr]
                    requests = [clamp(request, self.options.gutter_ttl) for request in requests]
                client.send(b"".join([request.encode() for request in requests]))
            except BaseException as exc:
                if observer is not None:
                    observer.failed(node.name, exchange.requests(kbs), exc, sent, began[node])
                settle(node, client, exc, kbs, sent)
            else:
                pending.append((node, client, kbs, requests))
        for node, client, kbs, requests in pending:  # 2. ...then read every reply
            replies: list[Any] | None = None
            try:
                replies = client.receive(requests)
                if observer is not None:
                    observer.request(node.name, tuple(requests), replies, began[node])
                part = exchange.result(replies, kbs)
            except BaseException as exc:
                if observer is not None and replies is None:
                    observer.failed(node.name, requests, exc, True, began[node])
                settle(node, client, exc, kbs, True)
            else:
                self._done(node, client)
                results.append(part)
        for node, kbs in skipped.items():
            if observer is not None:
                observer.skipped(node.name, exchange.requests(kbs))
            error = self._unavailable(node, None)
            if error is None:
                results.append(exchange.failed(kbs))
                lost.add(node.name)
            else:
                errors.append(error)
        if errors:
            raise errors[0]
        if owners and lost:  # a replica chosen for some keys just failed: the others answer
            for kb, name in owners.items():
                if name in lost:
                    results.append(self._reread(exchange, kb, name))
        return results

    def _reread(self, exchange: _Exchange[R], kb: bytes, avoid: str) -> R:
        """``kb`` read from its replicas other than ``avoid`` (which failed in this multi-get)."""
        assert self._routes is not None
        (request,) = exchange.requests([kb])

        def decode(reply: Any) -> R:
            return exchange.result([reply], [kb])

        failed = exchange.failed([kb])
        plan = self._routes.reread(kb, avoid, request, decode, failed, self.options.raise_errors)
        result: R = self._drive(plan)
        return result


# -- helpers ---------------------------------------------------------------------


def _answering(clients: list[Connection], timeout: float | None) -> Collection[Connection]:
    """The connections that start answering within one ``timeout``, waited for together.

    Reading replies one after another, each stalled server would cost a
    timeout of its own; waiting on all of them at once costs one.
    """
    if len(clients) < 2 or not timeout:
        return clients
    deadline = time.monotonic() + timeout
    waiting = {client.sock: client for client in clients if client.sock is not None}
    ready: set[Connection] = set()
    with selectors.DefaultSelector() as selector:
        for sock in waiting:
            selector.register(sock, selectors.EVENT_READ)
        while len(ready) < len(waiting):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for event, _ in selector.select(left):
                ready.add(waiting[event.fileobj])
                selector.unregister(event.fileobj)
    return ready


def _reassigned(
    owned: dict[str, list[bytes]], owners: Mapping[bytes, str]
) -> dict[str, list[bytes]]:
    """Keys per server, with each key of ``owners`` moved to the server named there."""
    moved: dict[str, list[bytes]] = defaultdict(list)
    for name, kbs in owned.items():
        for kb in kbs:
            moved[owners.get(kb, name)].append(kb)
    return moved


def _as_servers(servers: Sequence[str | Server] | str) -> tuple[Server, ...]:
    if isinstance(servers, str):
        return parse_servers(servers)
    parsed = tuple(s if isinstance(s, Server) else parse_server(s) for s in servers)
    if not parsed:
        raise ConfigurationError("no memcached servers configured", option="LOCATION")
    nodes = [s.node for s in parsed]
    for node in nodes:
        if nodes.count(node) > 1:
            raise ConfigurationError(f"server {node} is listed twice", option="LOCATION")
    return parsed


def _connection_factory(server: Server, options: SocketOptions) -> Callable[[], Connection]:
    def make_connection() -> Connection:
        return Connection(server.address, options)

    return make_connection


_ROUTES_KEPT = 8192  # ring bytes whose server is remembered (a few MB at most)


def _remembered_routes(ring_node: Callable[[bytes], str]) -> Callable[[bytes], str]:
    """``ring_node``, remembered: the server of the bytes a key is placed by.

    Hot keys come back all the time and their server never changes (the
    cluster's ring is fixed), so they skip the MD5 and the ring search: a dict
    lookup instead.  The ring bytes are a plain key's own or a route
    (:func:`~.keys.placed`), and the ring maps bytes, whichever they are.  Past
    :data:`_ROUTES_KEPT` entries the memory starts over.
    """
    routes: dict[bytes, str] = {}

    def locate(ring: bytes) -> str:
        node = routes.get(ring)
        if node is None:
            if len(routes) >= _ROUTES_KEPT:
                routes.clear()
            node = routes[ring] = ring_node(ring)
        return node

    return locate


def _encoded(serde: Serde, kb: bytes, value: Any) -> tuple[bytes, int]:
    data, flags = serde.serialize(kb, value)
    # Serialisers may return an int's digits as str (pymemcache's serdes do): sent as text.
    return (data if isinstance(data, bytes) else str(data).encode()), flags


def _raw(value: bytes) -> bytes:
    # append/prepend keep the item's flags, so only raw bytes make sense (store.py).
    if not isinstance(value, bytes):
        raise TypeError(f"append/prepend take bytes, not {type(value).__name__}")
    return value


def _delta(delta: int) -> int:
    if isinstance(delta, bool) or not isinstance(delta, int) or not 0 <= delta < _MAX_DELTA:
        raise ValueError(f"incr/decr delta must be an integer in [0, 2**64), not {delta!r}")
    return delta


def _expire(expire: int) -> int:
    if not isinstance(expire, int):
        raise ValueError(f"expire must be an integer, not {expire!r}")
    # "Expired at once" as an absolute time in 1970, which memcached treats as
    # it treats a negative exptime: twemproxy closes the connection on those.
    return _EXPIRED if expire < 0 else int(expire)


def _cas_token(cas: CasToken | str) -> bytes:
    """A cas token as memcached's ASCII digits: int, str or bytes (gets returns bytes)."""
    if isinstance(cas, int) and not isinstance(cas, bool) and cas >= 0:
        return b"%d" % cas
    token = cas.encode("ascii", "replace") if isinstance(cas, str) else cas
    if isinstance(token, bytes) and token.isdigit():
        return token
    raise ValueError(f"cas token must be memcached's unsigned integer, not {cas!r}")


# -- pure deciding helpers both drivers use (Cluster here, AsyncCluster in aio.py) --


def _no_meta(batch: tuple[Request[Any], ...]) -> None:
    """Refuse a meta command in text mode (``OPTIONS['protocol'] = 'text'``)."""
    meta = next((r for r in batch if isinstance(r, _META_REQUESTS)), None)
    if meta is not None:
        raise NeedsMetaProtocolError(
            f"{command_name(meta)} is a meta command, and OPTIONS['protocol'] is 'text'",
            option="protocol",
        )


def _no_refusal(name: str, batch: tuple[Request[Any], ...], replies: Sequence[Any]) -> None:
    """Raise when server ``name`` answered ``ERROR`` to a command it may not know."""
    for request, reply in zip(batch, replies, strict=True):
        refused = type(reply) is ErrorReply and reply.kind == "ERROR"
        if refused and isinstance(request, _REFUSABLE):  # memcached < 1.6: meta
            raise _not_supported(name, request, "answered ERROR to")


def _value_cas_ttl(
    deserialize: Callable[[bytes, bytes, int], Any], kb: bytes, reply: MetaReply | ErrorReply
) -> tuple[Any, CasToken | None, int | None]:
    """Decode ``mg <key> v c t f``: ``(value, cas, ttl)``, or all None on a miss."""
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    if reply.status == b"EN":
        return _NO_CAS_TTL
    if reply.status != b"VA" or reply.data is None or reply.cas is None:
        raise ProtocolError(f"reply {reply!r} does not answer mg v c t f")
    value = deserialize(kb, reply.data, reply.client_flags or 0)
    return value, b"%d" % reply.cas, reply.ttl


def _live(
    found: tuple[Any, CasToken | None, int | None],
) -> tuple[Any, CasToken | None, int | None]:
    """As gets: a value past its soft expiry, or refused, is a miss."""
    if found[0] is STALE or is_refused(found[0]):
        return _NO_CAS_TTL
    return found


def _text_cas_token(
    write: Store, replies: Sequence[Any], data: bytes, flags: int
) -> CasToken | None:
    """The cas of the item a text write and its ``gets`` (one write) read back, else None."""
    written, read = replies
    stored = _cas_stored(written) if write.command == "cas" else _written(written)
    item = _first_value(read)
    if not stored or item is None or (item.data, item.flags) != (data, flags):
        return None  # not stored, or replaced between the two commands
    return item.cas


def _meta_swap(kb: bytes, data: bytes, flags: int, token: bytes, expire: int) -> MetaSet:
    """``ms <key> C<cas> c``: store only if unchanged, returning the new cas."""
    return MetaSet(
        kb, data=data, cas=int(token), ttl=_expire(expire), client_flags=flags, return_cas=True
    )


def _swapped(
    kb: bytes, reply: MetaReply | ErrorReply | None
) -> tuple[bool | None, MetaDelete | None]:
    """cas_stale's verdict on its swap, and the ``md I`` of the version it wrote, if it did.

    None: the key is gone (NF); False: not swapped, or no reply (degrading view).
    """
    if reply is None:
        return False, None
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    if reply.status != b"HD":
        return (None if reply.status == b"NF" else False), None
    swapped = _meta_cas(reply)
    assert swapped is not None  # HD with c: _meta_cas checked the token
    return True, MetaDelete(kb, cas=int(swapped), invalidate=True)


def _refusal_seen(
    name: str, batch: tuple[Request[Any], ...], exc: BaseException
) -> tuple[CommandNotSupportedError | None, Request[Any] | None]:
    """What ``exc`` says of a command server ``name`` may not know, before any probe.

    ``(error, None)``: it answered ``ERROR`` (certain); ``(None, command)``: it
    closed the connection, so ask again (``_refusal``); ``(None, None)``: no
    refusal, the server is failing.
    """
    refused = next((r for r in batch if isinstance(r, _REFUSABLE)), None)
    if refused is None:
        return None, None
    if isinstance(exc, _UnknownCommand):
        return _not_supported(name, refused, "answered ERROR to"), None
    if not isinstance(exc, ConnectionClosedError):
        return None, None
    return None, refused


def _claim_batch(
    serde: Serde, kb: bytes, recache: int | None, placeholder: Any, placeholder_ttl: int
) -> list[Request[Any]]:
    """``mg v c t f R<recache>``, and the placeholder's add when one is given."""
    batch: list[Request[Any]] = [
        MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True, recache=recache)
    ]
    if placeholder is not None:
        data, flags = _encoded(serde, kb, placeholder)
        ttl = _expire(placeholder_ttl)
        batch.append(MetaSet(kb, data=data, mode="E", ttl=ttl, client_flags=flags, return_cas=True))
    return batch


def _claimed(serde: Serde, kb: bytes, replies: Sequence[Any]) -> Claimed:
    """Decode the replies to :func:`_claim_batch`'s requests."""
    read = replies[0]
    added = _meta_cas(replies[1]) if len(replies) > 1 else None
    if isinstance(read, ErrorReply):
        raise _reply_error(read)
    if read.status == b"EN":
        return Claimed(None, None, added=added)
    if read.status != b"VA" or read.data is None or read.cas is None:
        raise ProtocolError(f"reply {read!r} does not answer mg v c f t")
    found = serde.deserialize_envelope(kb, read.data, read.client_flags or 0)
    if is_refused(found):
        return Claimed(None, None, added=added)
    return Claimed(found, b"%d" % read.cas, read.won, read.lost, read.stale, added)


def _reply_error(reply: object) -> BaseException:
    """Our error for one of memcached's error replies: the caller's error, not the server's.

    Anything else a command's decoder was not written for is a mismatch.
    """
    if not isinstance(reply, ErrorReply):
        return ProtocolError(f"reply {reply!r} does not answer the request")
    if reply.too_large:
        # "SERVER_ERROR object too large for cache" (over -I, 1 MiB by default)
        return ValueTooLargeError(f"value too large for memcached: {reply.message}")
    if reply.non_numeric:
        # "CLIENT_ERROR cannot increment or decrement non-numeric value"
        return NonNumericValueError(reply.message)
    if reply.kind == "ERROR":
        return _UnknownCommand(f"memcached answered an error: {reply.message or reply}")
    return ServerError(f"memcached answered an error: {reply.message or reply}")


class _UnknownCommand(ServerError):
    """memcached's plain ``ERROR``: the command's name is unknown (protocol.txt)."""


def _not_supported(node: str, request: Request[Any], how: str) -> CommandNotSupportedError:
    verb = command_name(request)
    if isinstance(request, _META_REQUESTS):
        return CommandNotSupportedError(
            f"memcached at {node} does not speak the meta protocol (it {how} {verb}); "
            "set OPTIONS['protocol'] = 'text' for twemproxy, mcrouter or memcached before 1.6",
            node=node,
            command=verb,
            option="protocol",
        )
    return CommandNotSupportedError(
        f"memcached at {node} does not support {verb} (it {how} {verb}): a proxy such as "
        "twemproxy passes neither flush_all nor stats; send them to the servers behind it",
        node=node,
        command=verb,
    )


def _answer(node: _Node, request: Request[Any]) -> Any:
    """``request``'s reply on a new connection; None when refused (ERROR or closed) or down."""
    connection = node.connect_aside()
    try:
        reply = connection.request(request)
    except (OSError, ProtocolError):
        return None
    finally:
        connection.close()
    if type(reply) is ErrorReply and reply.kind == "ERROR":
        return None
    return reply


def _stored(reply: bytes | ErrorReply) -> bool:
    if reply is STORED or reply == STORED:
        return True
    if reply == NOT_STORED:
        return False
    raise _reply_error(reply)


def _written(reply: bytes | ErrorReply) -> bool:
    """A whole value's ``set``/``add``: as :func:`_stored`, and "out of memory" is not stored.

    memcached could not allocate the item (``SERVER_ERROR out of memory storing
    object``, under ``-M`` or a stream of large items): certainly not stored,
    a failed write like one over the size limit, never an error for the view.
    (append/prepend keep raising: there False would mean "missing or full".)
    """
    if isinstance(reply, ErrorReply) and reply.out_of_memory:
        return False
    return _stored(reply)


def _cas_stored(reply: bytes | ErrorReply) -> bool | None:
    if isinstance(reply, ErrorReply) and reply.out_of_memory:
        return False  # not stored (see _written)
    if reply == STORED:
        return True
    if reply == EXISTS:
        return False
    if reply == NOT_FOUND:
        return None
    raise _reply_error(reply)


def _deleted(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return reply == DELETED


def _bumped_text(reply: bytes | ErrorReply) -> bool:
    # NOT_STORED: the item exists (and add moved it to the LRU's head); STORED: it did not.
    if reply == NOT_STORED:
        return True
    if reply == STORED:
        return False
    raise _reply_error(reply)


def _bumped_meta(reply: MetaReply | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    if reply.status not in (b"HD", b"EN"):
        raise ProtocolError(f"reply {reply!r} does not answer a flagless mg")
    return reply.status == b"HD"


def _touched(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return reply == TOUCHED


def _ok(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return reply == OK


def _count(reply: int | ErrorReply | None) -> int | None:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return reply


def _ttl(reply: MetaReply | ErrorReply) -> int | None:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    if reply.status == b"EN":
        return None
    ttl = reply.ttl
    if reply.status != b"HD" or ttl is None:
        raise ProtocolError(f"reply {reply!r} does not answer mg t")
    return ttl


def _identity(reply: Any) -> Any:
    """The reply as it came (its caller judges it)."""
    return reply


def _meta_cas(reply: MetaReply | ErrorReply) -> CasToken | None:
    """An ``ms ... c`` reply: the new cas token when stored (``HD``), else None."""
    if isinstance(reply, ErrorReply):
        if reply.out_of_memory:
            return None  # not stored (see _written)
        raise _reply_error(reply)
    if reply.status != b"HD":
        return None  # NS (add: exists), EX (cas changed), NF (missing)
    if reply.cas is None:
        raise ProtocolError(f"reply {reply!r} does not answer ms ... c")
    return b"%d" % reply.cas


def _meta_deleted(reply: MetaReply | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return reply.status == b"HD"  # EX: another version; NF: missing


def _first_value(reply: list[Value] | ErrorReply) -> Value | None:
    if type(reply) is not list:
        raise _reply_error(reply)
    return reply[0] if reply else None


def _stat_value(text: str) -> Any:
    """A stat as a number where memcached prints one (``item_size_max`` is used as such)."""
    if text.isdigit():
        return int(text)
    try:
        return float(text) if text[:1].isdigit() and "." in text else text
    except ValueError:
        return text


def _stats(reply: dict[str, str] | ErrorReply) -> dict[str, Any]:
    if isinstance(reply, ErrorReply):
        raise _reply_error(reply)
    return {name: _stat_value(value) for name, value in reply.items()}


# -- multi-key commands ----------------------------------------------------------
#
# Each exchange says which wire requests (:mod:`.wire`) one server gets for its
# keys and what their replies amount to: get/gets answer VALUE blocks ended by
# END; each storage command and each delete answers exactly one line.


class _Exchange(Protocol[R_co]):
    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        """Return the requests one server gets for these keys."""
        ...

    def result(self, replies: list[Any], kbs: list[bytes]) -> R_co:
        """What that server's replies to :meth:`requests` amount to."""
        ...

    def failed(self, kbs: list[bytes]) -> R_co:
        """The result for keys whose server could not be used."""
        ...


@dataclass(frozen=True, slots=True)
class _Fetch:
    serde: Serde
    cas: bool = False
    envelopes: bool = False  # soft-expiry envelopes as Envelope (Store.get_many_envelopes)

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        return (Get(kbs, self.cas),)

    def result(self, replies: list[Any], kbs: list[bytes]) -> dict[bytes, Any]:
        (reply,) = replies
        if isinstance(reply, ErrorReply):
            raise _reply_error(reply)
        serde = self.serde
        deserialize = serde.deserialize_envelope if self.envelopes else serde.deserialize
        if self.cas:
            return {v.key: (deserialize(v.key, v.data, v.flags), v.cas) for v in reply}
        return {v.key: deserialize(v.key, v.data, v.flags) for v in reply}

    def failed(self, kbs: list[bytes]) -> dict[bytes, Any]:
        return {}


@dataclass(frozen=True, slots=True)
class _StoreMany:
    """``set`` per key; the result is the keys that were not stored.

    Over the size limit memcached swallows the data, drops the old item and
    answers ``SERVER_ERROR object too large for cache``: the stream stays in
    step, and that key simply failed.  So does a key memcached had no memory
    for (``SERVER_ERROR out of memory storing object``): not stored, certainly.
    """

    values: Mapping[bytes, tuple[bytes, int]]  # encoded: (data, flags)
    expire: int

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        values, expire = self.values, self.expire
        return [Store("set", kb, *values[kb], expire) for kb in kbs]

    def result(self, replies: list[Any], kbs: list[bytes]) -> list[bytes]:
        not_stored: list[bytes] = []
        for kb, reply in zip(kbs, replies, strict=True):
            if reply == STORED:
                continue
            refused = isinstance(reply, ErrorReply) and (reply.too_large or reply.out_of_memory)
            if reply == NOT_STORED or refused:
                not_stored.append(kb)
                continue
            raise _reply_error(reply)
        return not_stored

    def failed(self, kbs: list[bytes]) -> list[bytes]:
        return list(kbs)


@dataclass(frozen=True, slots=True)
class _DeleteMany:
    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        return [Delete(kb) for kb in kbs]

    def result(self, replies: list[Any], kbs: list[bytes]) -> None:
        for reply in replies:
            if isinstance(reply, ErrorReply):
                raise _reply_error(reply)

    def failed(self, kbs: list[bytes]) -> None:
        return None


_DELETE_MANY = _DeleteMany()

# -- process-wide sharing ---------------------------------------------------------


class _ProcessNodes:
    """Every server node of the process, so a forked child can drop their connections.

    Weakly held: a node lives as long as its cluster.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: weakref.WeakSet[_Node] = weakref.WeakSet()

    def add(self, node: _Node) -> None:
        with self._lock:
            self._nodes.add(node)

    def adopt(self, node: _Node) -> None:
        """Give ``node`` this process's own pool unless another thread just did."""
        with self._lock:
            if node.pid != _getpid():
                node.after_fork()

    def after_fork_in_child(self) -> None:
        """Run in a child right after ``fork``, while it has a single thread."""
        self._lock = threading.Lock()  # a vanished parent thread may have held it
        for node in list(self._nodes):
            node.after_fork()


_getpid = os.getpid
_journals: weakref.WeakSet[Journal] = weakref.WeakSet()


def _journals_after_fork() -> None:
    for journal in list(_journals):
        journal.after_fork()


os.register_at_fork(after_in_child=_journals_after_fork)
_process_nodes = _ProcessNodes()
os.register_at_fork(after_in_child=_process_nodes.after_fork_in_child)

_shared: Registry[Cluster] = Registry(on_reset=Cluster.close)


def shared_cluster(
    servers: Sequence[str | Server] | str,
    options: ClusterOptions | None = None,
    *,
    on_node_event: Callable[[NodeEvent], object] | None = None,
    on_value_refused: Callable[[ValueRefused], object] | None = None,
) -> Cluster:
    """Return the process's one Cluster for these servers and options.

    Django builds a cache backend per thread, and Django and Flask backends
    may name the same servers: they all get this instance, so connection pools
    and node health are shared.  The options decide everything the cluster
    does, its serde (serializer, signing) included, so callers that differ in
    any of them get different clusters; the listeners are added to the
    cluster, whoever built it (:meth:`Cluster.listen`).
    """
    parsed = _as_servers(servers)
    options = options or ClusterOptions()
    cluster = _shared.get_or_create((parsed, options), lambda: Cluster(parsed, options))
    cluster.listen(on_node_event=on_node_event, on_value_refused=on_value_refused)
    return cluster


def reset_shared_clusters() -> None:
    """Forget (and close) every shared cluster; for tests and reconfiguration."""
    _shared.reset()
