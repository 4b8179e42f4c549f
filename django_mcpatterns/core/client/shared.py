"""What a cluster, its strict view and its asyncio twin share: built once from servers and options.

:class:`Driver`, the base of both drivers, is one view of it: the Store
commands (:mod:`..protocol.commands`), the servers, options and serde they
answer with, and the introspection both offer (health, listeners, replicas,
the journal).  A driver subclass adds how it runs a plan (``run``), with its
round-trip primitive.

The servers' nodes (pools, health, channels), the ring and the router, the
serde and its decoders, the listeners and the observer: one of each per
cluster, so a server one API saw fail is failing for the others, and a sink
added to one is seen by all.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..exceptions import ConfigurationError
from ..ketama import Continuum
from ..keys import Key, placed
from ..observe import Observer, build_observer
from ..protocol.commands import StoreCommands
from ..protocol.compiled import hits, new_get
from ..protocol.compiled import placed as placed_fast
from ..protocol.decoding import Decoders
from ..protocol.wire import Stats
from ..values.envelope import with_envelopes
from ..values.refusals import ValueRefused
from . import epochs
from .health import HealthSnapshot, NodeEvent, NodeHealth
from .journal import Journal
from .node import Node, watch_forks
from .ops import Requests
from .options import ClusterOptions
from .outcomes import Listeners, unavailable
from .repairs import Epoch, epoch_of, repairer, restarted
from .replicas import ReplicaPolicy
from .routes import Routes
from .routing import Router, remembered
from .servers import Server, as_servers
from .transport import SocketOptions, answer

__all__ = ["Driver", "Shared"]

logger = logging.getLogger("django_mcpatterns.cluster")

Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)


class Shared:
    """One cluster's servers, routing, values and reporting (see the module docstring).

    ``observer`` is None unless ``OPTIONS["instrumentation"]`` asks for one (or
    a sink is added): one check per request.  ``sync`` and ``twin`` are the
    cluster's sync driver and its async twin, each made on first need
    (:meth:`sync_view`; ``Cluster.aio``).
    """

    # How a sync Cluster is made for these servers (the sync driver sets it when imported:
    # the async driver, which may be built first, never imports it).
    sync_driver: ClassVar[Callable[[Shared], Any] | None] = None

    def __init__(
        self,
        servers: Sequence[str | Server] | str,
        options: ClusterOptions,
        serde: Serde,
        clock: Callable[[], float],
        rng: Callable[[], float],
    ) -> None:
        self.servers = as_servers(servers)
        self.options = options
        self.node_listeners: Listeners[NodeEvent] = Listeners("on_node_event")
        self.restart_listeners: Listeners[str] = Listeners("on_restart")
        self.epochs: dict[str, Epoch] = {}  # each server's (pid, start time), once read
        self.met: dict[str, float] = {}  # when (clock) this process first connected to each
        self._checks: dict[str, float | None] = {}  # epochs to read: outage length, or None
        self._checks_lock = threading.Lock()  # request threads add, the repairer takes
        self.refused_listeners: Listeners[ValueRefused] = Listeners("on_value_refused")
        self.serde = with_envelopes(
            serde if serde is not None else options.serde_options.build(self.refused_listeners)
        )
        self.decoders = Decoders(self.serde)
        self.text = options.protocol == "text"
        self.ring = _ring(self.servers, options.ketama, names=True)
        self._socket_options = SocketOptions(
            connect_timeout=options.connect_timeout,
            timeout=options.timeout,
            **options.client_options,
        )
        self._clock, self._rng = clock, rng
        self.nodes = {server.node: self._node(server) for server in self.servers}
        self._meet()
        self.observer: Observer | None = build_observer(
            options.instrumentation_name,
            self.servers,
            options.instrumentation,
            registry=options.prometheus_registry,
            tracer_provider=options.tracer_provider,
            trace_keys=options.trace_keys,
        )
        self.refused_listeners.add(self._observe_refused)
        # With one server every key maps to it: skip the hash on the hot path.
        only = self.servers[0].node
        known: dict[bytes, str] = {}  # the servers locate remembers
        locate = (
            remembered(self.ring.get_node, known) if len(self.servers) > 1 else lambda ring: only
        )
        # What each server missed, repaired before it serves again (journal.py): a server
        # with entries is held, so the hot path skips it.
        self.journal = Journal()
        self.journal.hold = self._hold
        watch_forks(self.journal)
        watch_forks(self)
        # Replicated keys and the gutter pool (replicas.py, gutter.py): off unless configured.
        self.gutter_nodes: dict[str, Node] = {}
        routes = None
        policy = ReplicaPolicy.build(options.replicate, options.replicate_scope)
        if policy is not None or options.failover == "gutter":
            gutter_ring = self._gutter()
            routes = Routes(
                ring=self.ring,
                nodes=self.nodes,
                locate=locate,
                policy=policy,
                gutter_ring=gutter_ring,
                gutter_nodes=self.gutter_nodes,
                gutter_ttl=options.gutter_ttl,
                rng=rng,
                journal=self.journal,
            )
        remap = options.failover == "remap"
        self.router = Router(
            self.ring, self.nodes, self.gutter_nodes, locate, remap, routes, self.journal, known
        )
        self.routes = routes
        self.sync: Any = None
        self.twin: Any = None

    def sync_view(self) -> Any:
        """The cluster's sync driver (a ``Cluster``), made now if the async twin came first."""
        if self.sync is None:
            make = Shared.sync_driver
            if make is None:
                raise RuntimeError(
                    "the sync driver is not loaded: import django_mcpatterns.core.cluster"
                )
            self.sync = make(self)
        return self.sync

    def _node(self, server: Server) -> Node:
        """One server's pool and health (a ring server's or a gutter server's)."""
        options = self.options
        health = NodeHealth(
            server.node,
            retry_attempts=options.retry_attempts,
            retry_timeout=options.retry_timeout,
            dead_timeout=options.dead_timeout,
            clock=self._clock,
            report=self.report,
            rng=self._rng,
            back=self._back,
        )
        return Node(
            server, health, self._socket_options, options.max_pool_size, options.pool_idle_timeout
        )

    def _gutter(self) -> Continuum | None:
        """The gutter pool's servers (with their own health) and its ketama ring, if any."""
        if not self.options.gutter:
            return None
        try:
            servers = as_servers(list(self.options.gutter))
        except ConfigurationError as exc:
            raise ConfigurationError(f"OPTIONS['gutter']: {exc}", option="gutter") from exc
        for server in servers:
            self.gutter_nodes[server.node] = self._node(server)
        return _ring(servers, self.options.ketama, names=False)

    # -- outages: the journal's holds, servers back, epochs (repairs.py) --

    def _hold(self, name: str, held: bool) -> None:
        node = self.nodes.get(name)
        if node is not None:
            node.health.hold(held)
            if held:
                repairer().wake(self)

    def _meet(self) -> None:
        """Note when this process first connects to each server (:attr:`met`): no request.

        A server was up then, so one whose uptime is longer did not restart
        since; see :func:`.repairs.restarted`.
        """
        me = weakref.WeakMethod(self._met)  # a cluster that never connects may go

        def met(name: str) -> None:
            shared = me()
            if shared is not None:
                shared(name)

        for name, node in self.nodes.items():
            epochs.when_opened(node.server.address, functools.partial(met, name))

    def _met(self, name: str) -> None:
        self.met.setdefault(name, self._clock())

    def _back(self, event: NodeEvent) -> None:
        """A failing server answered again: logged once, and its epoch read in the background."""
        logger.warning(
            "memcached server %s is back (unavailable for %.1fs)", event.node, event.down
        )
        if event.node in self.nodes:
            with self._checks_lock:
                if not self._checks and not self.epochs:  # the first outage: the others' too
                    self._checks.update(dict.fromkeys(self.nodes))
                self._checks[event.node] = event.down
            repairer().wake(self)

    def repair_round(self) -> bool:
        """The repairer's round: replay the journals that may be, read the epochs asked for.

        Return whether work is left (a server still owes repairs).
        """
        if self.journal.dirty:
            self.sync_view().repair()
        with self._checks_lock:
            checks, self._checks = self._checks, {}
        for name, down in checks.items():
            self._read_epoch(name, down)
        return bool(self.journal.dirty or self._checks)

    def after_fork(self) -> None:
        """A forked child gets a new lock (a vanished parent thread may have held it)."""
        self._checks_lock = threading.Lock()

    def _read_epoch(self, name: str, down: float | None) -> None:
        """Read ``name``'s epoch (``down``: it was out that long; None: just remember it)."""
        epoch, uptime = epoch_of(answer(self.nodes[name].connect_aside(), Stats()))
        if epoch is None:
            return  # down again, or a proxy that does not pass stats
        known = self.epochs.get(name)
        self.epochs[name] = epoch
        met = self.met.get(name)
        since = None if met is None else self._clock() - met
        if down is not None and restarted(known, epoch, uptime, down, since):
            logger.warning(
                "memcached server %s restarted (up %ds): everything it held is gone", name, uptime
            )
            if self.observer is not None:
                self.observer.event("node_restarted")
            self.restart_listeners(name)

    def observe(self) -> Observer:
        """The observer, made now if instrumentation is off (a sink is being added)."""
        if self.observer is None:
            self.observer = Observer(self.options.instrumentation_name, list(self.nodes))
        return self.observer

    def _observe_refused(self, event: ValueRefused) -> None:
        if self.observer is not None:
            self.observer.event("value_refused")

    def report(self, event: NodeEvent) -> None:
        """A node event: logged, observed, told to the listeners.

        An outage is logged once when it starts (the failure that takes the
        server out) and once when it ends (:meth:`_back`), as warnings, which
        Python shows without any logging configuration; the rest at INFO or DEBUG.
        """
        if event.kind == "failure" and event.failures == 1:
            logger.warning(
                "memcached server %s is unavailable (%s): its operations fail fast until "
                "it answers again",
                event.node,
                event.error,
            )
        elif event.kind == "dead":
            logger.info("memcached server %s is dead: %s", event.node, event.error)
        elif event.kind == "failure":
            logger.debug("memcached server %s failed: %r", event.node, event.error)
        observer = self.observer
        if observer is not None:
            observer.server_state(event.node, event.kind == "revived")
            if event.kind != "failure":
                observer.event(f"node_{event.kind}")
        self.node_listeners(event)


def _ring(servers: Sequence[Server], variant: str, names: bool) -> Continuum:
    weighted = any(s.weight != 1 for s in servers)
    return Continuum(
        [s.node for s in servers],
        weights=[s.weight for s in servers] if weighted else None,
        variant=variant,
        names=[s.name for s in servers] if names else None,
    )


class Driver(StoreCommands):
    """One view (default or strict) of a cluster's :class:`~.shared.Shared` state."""

    def _adopt(self, shared: Shared, options: ClusterOptions) -> None:
        self.shared = shared
        self.options = options
        self.servers = shared.servers
        self.serde = shared.serde
        self.decoders = shared.decoders
        self.text = shared.text
        self.ring = shared.ring
        self.router = shared.router
        self._strict_view = options.raise_errors  # raise where the default view degrades
        # Read on the hot path: plain attributes, not the shared object's.
        self._routes = shared.routes
        self._nodes = shared.nodes
        self._locate = shared.router.locate
        # A single server is every key's: the hot path skips the ring.
        self._only = next(iter(shared.nodes.values())) if len(shared.nodes) == 1 else None

    def __repr__(self) -> str:
        nodes = ", ".join(self._nodes)
        return f"<{type(self).__name__} {nodes} ketama={self.options.ketama}>"

    @property
    def observer(self) -> Observer | None:
        """The observer of this cluster (its views' and twin's too), or None (not observed)."""
        return self.shared.observer

    def copies(self, kb: bytes, ring: bytes) -> int:
        return self.router.copies(kb, ring)

    def server_epoch(self, key: Key) -> tuple[str, int] | None:
        """The epoch of ``key``'s server (:mod:`.epochs`): it changes whenever that server
        may have restarted since.  None when no cas read from it can be trusted later: a
        key kept on several servers, or a server that is failing (its keys go elsewhere)."""
        kb, ring = placed(key)
        if self.copies(kb, ring) > 1:
            return None
        node = self._nodes[self._locate(ring)]
        if node.health.open is None:
            return None
        return node.name, epochs.current(node.server.address)

    @property
    def carries(self) -> bool:
        """Whether :meth:`get_along` can add keys to a get: no replicas or gutter (which
        server answers a key is then decided per key)."""
        return self._routes is None

    def get_along(self, key: Key, others: Sequence[str]) -> Any:
        """One ``get`` of ``key`` with those of ``others`` its server holds too, in one
        request to that server (the near cache's refresh ahead): ``(hits by key as given,
        the others sent)`` (``({}, ())`` when the server failed and the view degrades),
        or None when nothing goes along (then nothing is sent): no other key on its
        server, a server that is failing, replicas or the gutter (which server answers
        is then not the keys' own).  On the async driver, a coroutine of that.

        The request goes to the key's own server or nowhere: never failed over, so an
        answer for another key is always from that key's home.
        """
        if self._routes is not None:
            return None
        kb, ring = placed_fast(key)
        only = self._only
        node = only or self._nodes[self._locate(ring)]
        admission = node.health.open
        if admission is None:
            return None
        given: dict[bytes, Key] = {kb: key}
        sent = []
        for other in others:
            okb, oring = placed_fast(other)
            if only is None and self._nodes[self._locate(oring)] is not node:
                continue
            if okb not in given:
                given[okb] = other
                sent.append(other)
        if not sent:
            return None
        fetch = self.decoders.fetch

        def decode(reply: Any) -> tuple[dict[Key, Any], list[str]]:
            return hits([fetch.result([reply], [])], given, False), sent

        return self.run_on(node, admission, new_get(list(given), False), decode, ({}, ()))

    def run_on(
        self, node: Node, admission: Any, request: Requests, decode: Any, failed: Any
    ) -> Any:
        """One round trip to ``node`` itself, admitted (never failed over): ``decode``'s
        answer, or ``failed`` when the server fails and the view degrades (the driver's
        round-trip primitive; on the async driver, a coroutine of that)."""
        raise NotImplementedError

    def replicated_keys(self, given: Mapping[bytes, Key]) -> dict[bytes, bytes]:
        routes = self._routes
        return routes.replicated_keys(given) if routes is not None else {}

    def _refuse(self, node: Node, failed: Any, request: Requests | None) -> Any:
        """Fail fast: the server is in its retry or dead wait (the strict view raises)."""
        observer = self.shared.observer
        if observer is not None and request is not None:
            observer.skipped(node.name, request)
        if self._strict_view:
            raise unavailable(node, None)
        return failed

    # -- listeners and introspection --

    def listen(
        self,
        *,
        on_node_event: Callable[[NodeEvent], object] | None = None,
        on_value_refused: Callable[[ValueRefused], object] | None = None,
        on_restart: Callable[[str], object] | None = None,
    ) -> None:
        """Also tell these of node events, of items the default serde refuses, and of
        servers that restarted empty (``on_restart(node)``, see :mod:`.repairs`).

        Listeners add up, each once however often it is given (compared with
        ``==``: pass the same function, not a new ``partial`` each time); a
        cluster, its views and its twin share them.
        """
        if on_node_event is not None:
            self.shared.node_listeners.add(on_node_event)
        if on_value_refused is not None:
            self.shared.refused_listeners.add(on_value_refused)
        if on_restart is not None:
            self.shared.restart_listeners.add(on_restart)

    def health(self) -> dict[str, HealthSnapshot]:
        """Return every server's health, by node."""
        return {name: node.health.snapshot() for name, node in self._nodes.items()}

    def gutter_health(self) -> dict[str, HealthSnapshot]:
        """Return every gutter server's health, by node (empty without the gutter policy)."""
        gutter = self.shared.gutter_nodes
        return {name: node.health.snapshot() for name, node in gutter.items()}

    def replicas(self, key: Key) -> list[str]:
        """Return the servers that hold ``key``: its home first, then its copies."""
        kb, ring = placed(key)
        return self.ring.get_nodes(ring, self.router.copies(kb, ring))

    def journal(self) -> dict[str, int]:
        """Return how many keys each server still has to repair before it serves (journal.py)."""
        return self.shared.journal.pending()

    def epochs(self) -> dict[str, tuple[int, int]]:
        """Each server's epoch as last read, ``(pid, start time)`` (:mod:`.repairs`)."""
        return dict(self.shared.epochs)
