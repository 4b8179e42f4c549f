"""AsyncCluster: the Store protocol on memcached servers, for asyncio (the async driver).

An :class:`AsyncCluster` runs the same command plans as
:class:`~.cluster.Cluster` (:mod:`..protocol.commands`) and answers exactly as
it does (the same Store contract suite runs on both), with its methods as
coroutines (:class:`~..store.AsyncStore`).  It is the *twin* of a Cluster: it
shares that cluster's ring, options, serde, listeners, observer and each
server's :class:`~.health.NodeHealth` (:mod:`.shared`: one process view of a
server, whichever API saw it fail), and has connections of its own.
``Cluster(...).aio`` returns the twin (made once); ``AsyncCluster(servers,
options)`` takes the constructor of Cluster and makes a Cluster to be the twin of.

Connections
    One pipelined :class:`~.channel.Channel` per server and event loop
    (:mod:`.links`), opened on first use: every task of the loop shares it,
    so commands issued in one loop iteration leave in one write, and reads by
    key (a lone ``get``/``gets``) are batched and deduplicated (see
    :mod:`.channel`).  A channel is never shared between loops, and a forked
    child never uses one it inherited (:mod:`.node`).
The round trip
    :meth:`AsyncCluster._trip` is the one primitive: channel, "was it sent"
    (a request queued but never written is :class:`~.channel.NotSentError`:
    certainly not applied), observation and outcome judging
    (:mod:`.outcomes`); several servers at once (:meth:`_parallel`) queue
    every request before awaiting any reply, without tasks.  Where the compiled
    hot path is built, :meth:`run` and ``_trip``'s commonest case (a healthy
    server's lone ``get``/``gets``, nothing observed) run in C as one awaitable
    (``src/speedups/trip.c``), which hands everything else to these methods.
Cancellation
    A cancelled task's request still gets its reply read by the channel and
    dropped, so a cancellation never leaves a connection out of step.
Threads
    None: no executor, no ``sync_to_async``; nothing here blocks the loop.
Instrumentation
    The twin reports to its cluster's observer.  A read by key is reported as
    the ``get``/``gets`` of its own keys, with the time its caller waited:
    reads of one loop iteration share a request on the wire, and each
    caller's outcome is its own.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from asyncio import get_running_loop
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from time import perf_counter_ns
from typing import Any, TypeVar

from .. import chance
from ..protocol.compiled import async_runner, async_trip
from ..protocol.plans import MISS, Call, Each, FanOut, Forget, HomeToken, Plan, install
from ..protocol.replies import not_supported, refused_in
from ..protocol.wire import Get, Request, Value, Version
from ..store import AsyncLeaseStore, AsyncStore, AsyncTokenStore, Store
from .channel import Batch, Channel, NotSentError
from .health import Admission, NodeEvent
from .links import answer
from .node import Node, armed, forked
from .ops import FAILED, Decode, Parallel, Refuse, Requests, Run, Target
from .options import ClusterOptions
from .outcomes import NODE_ERRORS, answered, judge, probe_for, refusal_seen
from .servers import Server
from .shared import Driver, Serde, Shared
from .transport import completed

__all__ = ["AsyncCluster"]

R = TypeVar("R")

Waiters = list["asyncio.Future[Any]"]


class AsyncCluster(Driver, AsyncStore, AsyncTokenStore, AsyncLeaseStore):
    """The :class:`~..store.AsyncStore` protocol on a cluster of memcached servers.

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
        rng: Callable[[], float] = chance.uniform,
    ) -> None:
        options = options or ClusterOptions()
        shared = Shared(servers, options, serde, clock, rng)
        self._adopt(shared, options, None)
        shared.twin = self
        self.listen(on_node_event=on_node_event)

    @classmethod
    def twin_of(cls, cluster: Any) -> AsyncCluster:
        """The async twin of a ``Cluster`` (prefer ``cluster.aio``, which makes it once)."""
        twin = cls.__new__(cls)
        twin._adopt(cluster.shared, cluster.options, cluster)
        return twin

    def _adopt(self, shared: Shared, options: ClusterOptions, sync: Any = None) -> None:
        super()._adopt(shared, options)
        self._sync = sync  # the sync twin, when this is the twin of a given Cluster
        self._strict: AsyncCluster | None = None

    @property
    def sync(self) -> Store:
        """The sync twin: the ``Cluster`` this is the twin of (made now if this came first)."""
        if self._sync is None:
            main = self.shared.sync_view()
            self._sync = main.strict() if self._strict_view else main
        sync: Store = self._sync
        return sync

    # -- running plans --

    def run(self, plan: Plan[R]) -> Coroutine[Any, Any, R]:
        """Run a command's plan (:mod:`..protocol.plans`): the coroutine of its result.

        A healthy server's Call is one coroutine, the round trip itself.
        """
        if type(plan) is not Call:
            return self._drive(plan)
        if self._routes is None:
            node = self._only or self._nodes[self._locate(plan.ring)]
            admission = node.health.open
            if admission is not None:  # the hot path: a healthy server, nothing to route
                if trip is not None:  # compiled: _trip's hot path as one C awaitable
                    return trip(self, node, plan.request, plan.decode, plan.failed, admission)
                return self._trip(
                    node, plan.request, plan.decode, plan.failed, admission, True, True
                )
        return self._routed(plan)

    def run_on(
        self, node: Node, admission: Admission, request: Requests, decode: Decode, failed: Any
    ) -> Coroutine[Any, Any, Any]:
        return self._trip(node, request, decode, failed, admission)

    async def _routed(self, plan: Call[R]) -> R:
        """A Call whose server is not healthy, or under replicas or the gutter."""
        result = await self._drive(self.router.single(plan, self._strict_view))
        return plan.failed if result is MISS else result

    async def _drive(self, plan: Any) -> Any:
        """Run a plan of several steps; an op's exception (a cancellation too) is thrown in."""
        send, throw = plan.send, plan.throw
        try:
            op = next(plan)
            while True:
                try:
                    result = await self._perform(op)
                except BaseException as exc:
                    op = throw(exc)  # the plan cleans up (or handles it), or it propagates
                else:
                    op = send(result)
        except StopIteration as done:
            return done.value

    async def _perform(self, op: Any) -> Any:
        kind = type(op)
        if kind is Run:
            return await self._trip(op.node, op.request, op.decode, FAILED, op.admission, op.loud)
        if kind is Call:
            return await self.run(op)
        if kind is Parallel:
            return await self._parallel(op.targets, op.loud)
        if kind is Refuse:
            return self._refuse(op.node, op.failed, op.request)
        if kind is FanOut:
            direct = self.router.direct(op)
            if direct is None:
                return await self._drive(self.router.fan_out(op, self._strict_view))
            if len(direct) == 1:  # one server: its requests are one round trip
                (node, request, admission, decode), kbs = direct[0]
                answer = await self._trip(node, request, decode, FAILED, admission)
                return [op.exchange.failed(kbs) if answer is FAILED else answer]
            answers = await self._parallel([target for target, _ in direct], True)
            return [
                op.exchange.failed(kbs) if answer is FAILED else answer
                for (_, kbs), answer in zip(direct, answers, strict=True)
            ]
        if kind is Each:
            return await self._drive(self.router.each(op, self._strict_view))
        if kind is HomeToken:
            return await self._drive(self.router.home_token(op.kb, op.token))
        if kind is Forget:
            return await self._drive(self.router.forget(op))
        raise TypeError(f"not an op: {op!r}")

    # -- the round-trip primitive --

    async def _trip(
        self,
        node: Node,
        request: Requests,
        decode: Decode,
        failed: Any,
        admission: Admission,
        loud: bool = True,
        miss: bool = False,
    ) -> Any:
        """Queue ``request`` on ``node``'s channel, await and decode its reply (as Cluster._trip).

        A lone ``get``/``gets`` joins the loop iteration's batch of reads.
        ``miss``: a decoded :data:`~..protocol.plans.MISS` answers ``failed`` (a Call's).
        """
        if not armed[0]:
            forked()  # forked without Python's at-fork hooks (uWSGI's)
        loop = get_running_loop()
        links = node.links
        channel = links.channels.get(loop)  # links.current(loop), inlined: the hot path
        if channel is not None and channel.broken is not None:
            channel = None
        sent = channel is not None  # from here on the command may reach memcached
        observer = self.shared.observer
        started = perf_counter_ns() if observer is not None else 0
        try:
            if channel is None:
                channel = await links.channel(loop)
                sent = True
            if isinstance(request, Get) and len(request.keys) == 1:  # the hot path: one key
                kb = request.keys[0]
                batch = await channel.fetch_one(kb, request.cas, request)
                if type(batch) is Batch:
                    item = batch.values.get(kb)
                    reply: Any = [] if item is None else [item]
                else:
                    reply = batch  # memcached's error reply: the decoder judges it
            else:
                waiters, read = _queue(channel, request)
                if read is None:  # written as it is: its replies (one's, alone)
                    replies = await waiters[0]
                    reply = replies if type(request) is tuple else replies[0]
                else:  # reads by key, batched
                    reply = await _reply(waiters, read, request)
            if observer is not None:  # the reply as memcached gave it, before decoding
                observer.request(node.name, request, reply, started)
                observer = None
            result = reply if decode is None else decode(reply)
        except asyncio.CancelledError as exc:
            if observer is not None:  # a write sent is unknown; counted and timed either way
                observer.failed(node.name, request, exc, sent, started)
            if admission.probe:  # its reply is the channel's to read; a probe gives way
                node.health.released()
            raise
        except BaseException as exc:
            observed = observer is None
            return await self._failed(
                node, channel, request, exc, admission, sent, loud, started, failed, observed
            )
        if node.health.failures:
            answered(node, self.shared.observer, admission)
        if decode is None:
            refused = refused_in(node.name, request, reply)  # type: ignore[arg-type]
            if refused is not None:  # memcached < 1.6 answered ERROR to a meta command
                raise refused
        elif miss and result is MISS:
            return failed
        return result

    async def _parallel(self, targets: list[Target], loud: bool) -> list[Any]:
        """Each target's :meth:`_trip`, every request queued before any reply is awaited.

        No tasks: awaiting the replies in turn costs no more than the slowest.
        A server failure is that target's ``FAILED``; an error for the caller
        (``loud``: the strict view's server failures too) is raised once every
        reply has been read.
        """
        results: list[Any] = [FAILED] * len(targets)
        errors: list[BaseException] = []
        loop = asyncio.get_running_loop()
        observer = self.shared.observer
        # When each target's reply came (observed only): replies are awaited in turn, so
        # a target's turn comes after the targets before it; each is timed to its own reply.
        came: dict[int, int] = {}
        queued: list[tuple[int, Target, Channel, Waiters, Get | None, int]] = []
        pending = list(enumerate(targets))
        if not armed[0]:
            forked()
        try:
            while pending:  # 1. queue every server's requests (no await but to connect)...
                i, target = pending[0]
                node = target[0]
                links = node.links
                channel = links.current(loop)
                sent = channel is not None
                started = perf_counter_ns() if observer is not None else 0
                try:
                    if channel is None:
                        channel = await links.channel(loop)
                        sent = True
                    waiters, read = _queue(channel, target[1])
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    await self._settle(target, channel, exc, sent, loud, started, errors)
                else:
                    if observer is not None:
                        for waiter in waiters:
                            waiter.add_done_callback(partial(_stamp, came, i))
                    queued.append((i, target, channel, waiters, read, started))
                del pending[0]
            while queued:  # 2. ...then await every reply
                i, target, channel, waiters, read, started = queued[0]
                node, request, admission, decode = target
                replied = False
                try:
                    if read is None:  # written as it is: its replies (one's, alone)
                        replies = await waiters[0]
                        reply = replies if type(request) is tuple else replies[0]
                    else:  # reads by key, batched
                        reply = await _reply(waiters, read, request)
                    replied = True
                    if observer is not None:  # timed to its own reply
                        late = perf_counter_ns() - came.get(i, perf_counter_ns())
                        observer.request(node.name, request, reply, started + late)
                    results[i] = reply if decode is None else decode(reply)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:
                    await self._settle(target, channel, exc, True, loud, started, errors, replied)
                else:
                    if node.health.failures:
                        answered(node, self.shared.observer, admission)
                del queued[0]
        except asyncio.CancelledError as exc:
            if observer is not None:  # sent: every queued server's; not sent: the pending
                for _, (node, request, *_), _, _, _, started in queued:
                    observer.failed(node.name, request, exc, True, started)
                for _, (node, request, *_) in pending:
                    observer.failed(node.name, request, exc, False, 0)
            for node, _, admission, _ in [t for _, t, *_ in queued] + [t for _, t in pending]:
                if admission.probe:
                    node.health.released()
            raise
        if errors:
            raise errors[0]
        return results

    async def _settle(
        self,
        target: Target,
        channel: Channel | None,
        exc: BaseException,
        sent: bool,
        loud: bool,
        started: int,
        errors: list[BaseException],
        replied: bool = False,
    ) -> None:
        """A target of :meth:`_parallel` failed: FAILED, or an error kept for the caller."""
        node, request, admission, _ = target
        try:
            await self._failed(
                node, channel, request, exc, admission, sent, loud, started, None, replied
            )
        except BaseException as error:
            errors.append(error)

    async def _failed(
        self,
        node: Node,
        channel: Channel | None,
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
        reached = sent and not isinstance(exc, NotSentError)  # queued, never written: not applied
        observer = self.shared.observer
        if observer is not None and not observed:
            observer.failed(node.name, request, exc, reached, started)
        refusal = await self._refusal(node, request, exc) if sent else None
        if refusal is not None:  # a setting, not a failing server: health untouched
            if admission.probe:
                node.health.released()
            raise refusal from exc
        if isinstance(exc, NODE_ERRORS) and channel is not None:
            channel.fail(exc)  # a reply out of step, or a dead connection
        error = judge(node, exc, admission, reached, loud and self._strict_view)
        if error is None:
            return failed
        raise error from error.__cause__

    async def _refusal(self, node: Node, request: Requests, exc: BaseException) -> Any:
        """As :meth:`Cluster._refusal`, probing on new connections of this loop."""
        batch = request if type(request) is tuple else (request,)
        refusal, refused = refusal_seen(node.name, batch, exc)  # type: ignore[arg-type]
        if refused is None:
            return refusal
        links = node.links
        if await answer(links, probe_for(refused)) is not None:
            return None
        if await answer(links, Version()) is None:
            return None
        return not_supported(node.name, refused, "closed the connection on")

    # -- views, listeners, introspection --

    def strict(self) -> AsyncCluster:
        """As :meth:`Cluster.strict`: raise where the default view degrades (same connections)."""
        if self._strict_view:
            return self
        if self._strict is None:
            view = copy.copy(self)
            options = dataclasses.replace(self.options, raise_errors=True)
            view._adopt(self.shared, options, None)
            self._strict = view
        return self._strict

    async def close(self) -> None:
        """Close this event loop's connections once idle; node health is kept."""
        loop = asyncio.get_running_loop()
        for node in [*self._nodes.values(), *self.shared.gutter_nodes.values()]:
            node.links.close(loop)


install(AsyncCluster, asynchronous=True)
trip = async_trip(Batch, answered, MISS, armed, completed)
run_in_python = AsyncCluster.run
if trip is not None:  # compiled: run's hot path in C too (the plan's Call straight to a Trip)
    setattr(AsyncCluster, "run", async_runner(run_in_python))  # noqa: B010 (mypy: a method)


def _queue(channel: Channel, request: Requests) -> tuple[Waiters, Get | None]:
    """Queue ``request`` on ``channel``: the futures of its reply, and the read it is (if one).

    A lone ``get``/``gets`` joins the batch of reads by key of this loop
    iteration (a key already on the wire shares that reply).
    """
    batch: tuple[Request[Any], ...] = request if isinstance(request, tuple) else (request,)
    if len(batch) == 1 and type(batch[0]) is Get:
        read: Get = batch[0]
        keys = read.keys
        if len(keys) == 1:
            return [channel.fetch_one(keys[0], read.cas)], read
        return channel.fetch(keys, read.cas, read), read
    return [channel.submit(batch)], None


async def _reply(waiters: Waiters, read: Get, request: Requests) -> Any:
    """The reply to a read by key from its batches' futures: the values of its own keys."""
    answered: list[dict[bytes, Value]] = []
    error: Any = None
    for waiter in waiters:  # every one awaited: none is left unretrieved
        batch = await waiter
        if type(batch) is Batch:
            answered.append(batch.values)
        elif error is None:
            error = batch  # memcached's error reply: the decoder judges it
    if error is not None:
        found: Any = error
    elif len(answered) == 1:
        (values,) = answered
        found = [values[kb] for kb in read.keys if kb in values]
    else:  # each key is in one batch: the newest asking for it
        found = [v[kb] for kb in read.keys for v in answered if kb in v]
    return [found] if type(request) is tuple else found


def _stamp(came: dict[int, int], i: int, _: asyncio.Future[Any]) -> None:
    """Note when target ``i``'s reply came (its last one, for several futures)."""
    came[i] = perf_counter_ns()
