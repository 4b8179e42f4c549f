"""Cluster: the Store protocol over many memcached servers, on blocking sockets (the sync driver).

Every command is a plan of :mod:`..protocol.commands` (written once, for this
driver and the asyncio one); this module runs plans.  It has one round-trip
primitive, :meth:`Cluster._trip`: checkout, "was it sent", observation and
outcome judging happen there and nowhere else; several servers at once
(:meth:`Cluster._parallel`: multi-key fan-outs, replicated writes) run its two
halves, every request written before any reply is read, so four servers cost
about one round trip, not four as in pymemcache's ``HashClient``.

Connections
    One thread-safe pool of :class:`~.transport.Connection` objects per server
    (:mod:`.node`), never shared with a forked child.  Every request is encoded
    and every reply parsed by the sans-IO codec of :mod:`..protocol`; every
    command waits for its reply, so ``add``/``delete`` answers are real.
Replies
    A reply that does not match its request (a key that was not asked for, a
    line out of step, bytes nobody asked for) is a :class:`ProtocolError`: the
    connection is closed and the operation fails as on a server failure, never
    with a wrong value or a stray ``KeyError``.
Routing, failover, replicas, the gutter
    :mod:`.routing`; a healthy server's single-key command skips the plans
    there and is run at once (the hot path, lock-free).
Outcomes
    :mod:`.outcomes`: stored, not stored, or unknown; the strict view
    (:meth:`Cluster.strict`) raises :class:`OutcomeUnknownError` for the last.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any, TypeVar

from .. import chance
from ..observe import Observer, Sink
from ..protocol.compiled import encode
from ..protocol.plans import MISS, Call, Each, FanOut, Forget, HomeToken, Plan, install
from ..protocol.replies import not_supported, refused_in
from ..protocol.wire import Version
from ..registry import Registry
from ..store import LeaseStore, Store, TokenStore
from ..values.refusals import ValueRefused
from .aio import AsyncCluster
from .health import Admission, HealthSnapshot, NodeEvent
from .node import Node, armed, forked
from .ops import FAILED, Decode, Parallel, Refuse, Requests, Run, Target
from .options import ClusterOptions
from .outcomes import NODE_ERRORS, answered, judge, probe_for, refusal_seen, unavailable
from .servers import Server, as_servers
from .shared import Driver, Serde, Shared
from .transport import Connection, answer, answering

__all__ = ["Cluster", "HealthSnapshot", "NodeEvent", "reset_shared_clusters", "shared_cluster"]

R = TypeVar("R")


class Cluster(Driver, Store, TokenStore, LeaseStore):
    """The Store protocol (see :mod:`..store`) on a cluster of memcached servers.

    ``servers`` are ``Server`` objects or specs (``"host:port[:weight]"``,
    unix socket paths).  ``serde`` serialises values (by default the
    :class:`~..serializers.ValueSerde` of ``options``: serializer and signing;
    an item it refuses reads as a miss and is told to the ``on_value_refused``
    listeners), wrapped to read soft-expiry envelopes as plain values
    (:mod:`..envelope`).  ``on_node_event`` receives a
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
        rng: Callable[[], float] = chance.uniform,
    ) -> None:
        options = options or ClusterOptions()
        shared = Shared(servers, options, serde, clock, rng)
        self._adopt(shared, options)
        shared.sync = self
        self.listen(on_node_event=on_node_event)

    @classmethod
    def of_shared(cls, shared: Shared) -> Cluster:
        """The sync driver of an async twin built first (``AsyncCluster(servers, ...)``)."""
        cluster = cls.__new__(cls)
        cluster._adopt(shared, shared.options)
        return cluster

    def _adopt(self, shared: Shared, options: ClusterOptions) -> None:
        super()._adopt(shared, options)
        self._strict: Cluster | None = None

    # -- running plans --

    def run(self, plan: Plan[R]) -> R:
        """Run a command's plan (:mod:`..protocol.plans`) and return its result."""
        if type(plan) is not Call:
            result: Any = self._drive(plan)
            return result  # type: ignore[no-any-return]
        if self._routes is None:
            node = self._only or self._nodes[self._locate(plan.ring)]
            admission = node.health.open
            if admission is not None:  # the hot path: a healthy server, nothing to route
                result = self._trip(node, plan.request, plan.decode, plan.failed, admission)
                return plan.failed if result is MISS else result
        result = self._drive(self.router.single(plan, self._strict_view))
        return plan.failed if result is MISS else result

    def run_on(
        self, node: Node, admission: Admission, request: Requests, decode: Decode, failed: Any
    ) -> Any:
        return self._trip(node, request, decode, failed, admission)

    def _drive(self, plan: Any) -> Any:
        """Run a plan of several steps; an op's exception is thrown into the plan."""
        send, throw = plan.send, plan.throw
        try:
            op = next(plan)
            while True:
                try:
                    result = self._perform(op)
                except BaseException as exc:
                    op = throw(exc)  # the plan cleans up (or handles it), or it propagates
                else:
                    op = send(result)
        except StopIteration as done:
            return done.value

    def _perform(self, op: Any) -> Any:
        kind = type(op)
        if kind is Run:
            return self._trip(op.node, op.request, op.decode, FAILED, op.admission, op.loud)
        if kind is Call:
            return self.run(op)
        if kind is Parallel:
            return self._parallel(op.targets, op.loud, op.together)
        if kind is Refuse:
            return self._refuse(op.node, op.failed, op.request)
        if kind is FanOut:
            direct = self.router.direct(op)
            if direct is None:
                return self._drive(self.router.fan_out(op, self._strict_view))
            if len(direct) == 1:  # one server: its requests are one round trip
                (node, request, admission, decode), kbs = direct[0]
                answer = self._trip(node, request, decode, FAILED, admission)
                return [op.exchange.failed(kbs) if answer is FAILED else answer]
            answers = self._parallel([target for target, _ in direct], True)
            return [
                op.exchange.failed(kbs) if answer is FAILED else answer
                for (_, kbs), answer in zip(direct, answers, strict=True)
            ]
        if kind is Each:
            return self._drive(self.router.each(op, self._strict_view))
        if kind is HomeToken:
            return self._drive(self.router.home_token(op.kb, op.token))
        if kind is Forget:
            return self._drive(self.router.forget(op))
        raise TypeError(f"not an op: {op!r}")

    # -- the round-trip primitive --

    def _trip(
        self,
        node: Node,
        request: Requests,
        decode: Decode,
        failed: Any,
        admission: Admission,
        loud: bool = True,
    ) -> Any:
        """Send ``request`` to ``node`` and decode its reply; on a failure answer ``failed``.

        ``decode`` None: a batch, answered as its list of replies.  ``loud``:
        the strict view raises for a server failure (a quiet run, a replica's,
        answers ``failed``).  Lock-free while the server is healthy.
        """
        client = None
        sent = False  # from here on the command may have reached memcached
        observer = self.shared.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            if not armed[0]:
                forked()  # forked without Python's at-fork hooks (uWSGI's)
            client = node.pool.get()
            if client.sock is None:
                client.connect()
            sent = True
            if decode is None:
                reply: Any = client.exchange(request)  # type: ignore[arg-type]
                result: Any = reply
            else:  # one request, or a server's part of a multi-key command (a tuple)
                if type(request) is tuple:
                    reply = client.exchange(request)
                else:
                    reply = client.request(request)  # type: ignore[arg-type]
                if observer is not None:  # the reply as memcached gave it, before decoding
                    observer.request(node.name, request, reply, started)
                    observer = None
                result = decode(reply)
        except BaseException as exc:
            return self._failed(
                node, client, request, exc, admission, sent, loud, started, failed, observer is None
            )
        if observer is not None:
            observer.request(node.name, request, reply, started)
        node.pool.release(client)  # self._done(node, client, admission), inlined
        if node.health.failures:
            answered(node, self.shared.observer, admission)
        if decode is None:
            refused = refused_in(node.name, request, reply)  # type: ignore[arg-type]
            if refused is not None:  # memcached < 1.6 answered ERROR to a meta command
                raise refused
        return result

    def _parallel(self, targets: list[Target], loud: bool, together: bool = False) -> list[Any]:
        """Each target's :meth:`_trip`, every request written before any reply is read.

        A server failure is that target's ``FAILED`` (recorded in its health);
        an error for the caller (``loud``: the strict view's server failures
        too) is raised once every reply has been read.
        """
        results: list[Any] = [FAILED] * len(targets)
        errors: list[BaseException] = []
        observer = self.shared.observer
        pending: list[tuple[int, Target, Connection, int]] = []
        for i, target in enumerate(targets):  # 1. write every server's requests...
            node, request = target[0], target[1]
            client = None
            sent = False
            started = perf_counter_ns() if observer is not None else 0
            try:
                if not armed[0]:
                    forked()
                client = node.pool.get()
                client.connect()
                sent = True
                batch = request if isinstance(request, tuple) else (request,)
                client.send(encode(batch))
            except BaseException as exc:
                self._settle(target, client, exc, sent, loud, started, errors)
            else:
                pending.append((i, target, client, started))
        clients = [client for _, _, client, _ in pending]
        ready = answering(clients, self.options.timeout) if together else clients
        for i, target, client, started in pending:  # 2. ...then read every reply
            node, request, admission, decode = target
            batch = request if isinstance(request, tuple) else (request,)
            replied = False
            try:
                if client not in ready:  # silent for a whole timeout, as the others ran
                    raise TimeoutError("timed out")
                replies = client.receive(batch)
                replied = True
                reply = replies if type(request) is tuple else replies[0]
                if observer is not None:  # the replies as memcached gave them, before decoding
                    observer.request(node.name, request, reply, started)
                results[i] = reply if decode is None else decode(reply)
            except BaseException as exc:
                self._settle(target, client, exc, True, loud, started, errors, replied)
            else:
                self._done(node, client, admission)
        if errors:
            raise errors[0]
        return results

    def _settle(
        self,
        target: Target,
        client: Connection | None,
        exc: BaseException,
        sent: bool,
        loud: bool,
        started: int,
        errors: list[BaseException],
        replied: bool = False,
    ) -> None:
        """A target of :meth:`_parallel` failed: FAILED, or an error kept for the caller."""
        try:
            node, request, admission, _ = target
            self._failed(node, client, request, exc, admission, sent, loud, started, None, replied)
        except BaseException as error:
            errors.append(error)

    def _failed(
        self,
        node: Node,
        client: Connection | None,
        request: Requests,
        exc: BaseException,
        admission: Admission,
        sent: bool,
        loud: bool,
        started: int,
        failed: Any,
        observed: bool = False,
    ) -> Any:
        """Judge a round trip that raised: answer ``failed``, or raise for the caller."""
        observer = self.shared.observer
        if observer is not None and not observed:  # no reply came
            observer.failed(node.name, request, exc, sent, started)
        refusal = self._refusal(node, request, exc) if sent else None
        if client is not None:
            node.pool.destroy(client)  # it may be mid-reply: never reuse it
        if refusal is not None:  # a setting, not a failing server: health untouched
            if admission.probe:
                node.health.released()
            raise refusal from exc
        if isinstance(exc, NODE_ERRORS):
            node.drop_idle()  # pooled siblings share the dead server's fate
        strict = loud and self._strict_view
        error = judge(node, exc, admission, sent, strict)
        if error is exc and client is None and isinstance(exc, RuntimeError):
            error = unavailable(node, exc) if strict else None  # the pool is exhausted
        if error is None:
            return failed
        raise error from error.__cause__

    def _refusal(self, node: Node, request: Requests, exc: BaseException) -> Any:
        """The error for a command the server does not know, or None: it is failing.

        memcached before 1.6 answers a meta command ``ERROR``: certain.
        twemproxy closes the connection instead, which a failing server does
        too, so the server is asked again on fresh connections: the same
        refusal of the command (``mn`` for a meta one) while ``version`` is
        answered means the server is up and does not know the command.
        """
        batch = request if type(request) is tuple else (request,)
        refusal, refused = refusal_seen(node.name, batch, exc)  # type: ignore[arg-type]
        if refused is None:
            return refusal
        if answer(node.connect_aside(), probe_for(refused)) is not None:
            return None
        if answer(node.connect_aside(), Version()) is None:
            return None
        return not_supported(node.name, refused, "closed the connection on")

    def _done(self, node: Node, client: Connection, admission: Admission) -> None:
        """Return a connection after a complete exchange and record the server's answer."""
        node.pool.release(client)
        if node.health.failures:
            answered(node, self.shared.observer, admission)

    # -- views, listeners, introspection --

    def strict(self) -> Cluster:
        """Return this cluster raising :class:`NodeUnavailableError` where it would degrade.

        The view shares the servers, connection pools and node health; only how
        an unreachable server is reported differs.  Locks use it to tell "held
        by someone else" from "server unreachable" while ordinary cache traffic
        keeps degrading to misses (:mod:`..locks`).
        """
        if self._strict_view:
            return self
        if self._strict is None:
            view = copy.copy(self)
            view.__dict__.pop("_aio", None)  # the view's own twin, made when asked for
            view._adopt(self.shared, dataclasses.replace(self.options, raise_errors=True))
            self._strict = view
        return self._strict

    @property
    def aio(self) -> AsyncCluster:
        """This cluster's asyncio twin (:class:`~.aio.AsyncCluster`), made once.

        It shares the ring, options, serde, listeners and every server's node
        health (one view of a server per process, whichever API saw it fail),
        and has connections of its own: one per server and event loop.
        """
        if self is self.shared.sync:
            if self.shared.twin is None:
                self.shared.twin = AsyncCluster.twin_of(self)
            twin: AsyncCluster = self.shared.twin
            return twin
        view_twin: AsyncCluster | None = self.__dict__.get("_aio")  # a view's (strict)
        if view_twin is None:
            view_twin = self.__dict__["_aio"] = AsyncCluster.twin_of(self)
        return view_twin

    def observe(self, sink: Sink) -> Observer:
        """Also send every request, pattern call and event to ``sink`` (:mod:`..observe`).

        The debug toolbar's panel does this; without instrumentation it gives
        the cluster (its views and twin too) an observer.
        """
        observer = self.shared.observe()
        observer.add(sink)
        return observer

    def repair(self) -> list[str]:
        """Replay now the journal of each server that owes repairs and may be contacted.

        Return the servers still owing (:mod:`.journal`); the repair thread
        (:mod:`.repairs`) calls this, and so may a management command.
        """
        self._drive(self.router.repair())
        return sorted(self.shared.journal.dirty)

    def close(self) -> None:
        """Close idle connections.  Node health and busy connections are kept."""
        for node in self._nodes.values():
            node.drop_idle()


install(Cluster, asynchronous=False)
Shared.sync_driver = Cluster.of_shared

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
    parsed = as_servers(servers)
    options = options or ClusterOptions()
    cluster = _shared.get_or_create((parsed, options), lambda: Cluster(parsed, options))
    cluster.listen(on_node_event=on_node_event, on_value_refused=on_value_refused)
    return cluster


def reset_shared_clusters() -> None:
    """Forget (and close) every shared cluster; for tests and reconfiguration."""
    _shared.reset()
