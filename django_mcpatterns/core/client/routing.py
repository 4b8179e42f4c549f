"""Which server answers: the ring, failover, key grouping, and the plans both drivers run.

Routing
    Every key goes to the server the :class:`~..ketama.Continuum` names for the
    key's final bytes, so pylibmc, PHP, twemproxy and spymemcached peers agree
    on where it lives.  The one exception is explicit: a
    :class:`~..keys.Routed` key (not ``bytes``: it cannot be converted by
    accident) is placed by its route's bytes, so every key of a namespace
    shares one server.  The route travels with the command (a
    :class:`~..protocol.plans.Call`'s ``ring``) to the server choice and the
    fan-out grouping.
Failover
    In one place: :meth:`Router.pick` decides which server an operation may
    use while its own is failing (``"miss"``: its own once the wait is over;
    ``"remap"``: the next server on the ring that may be contacted); the
    gutter and replicas are :class:`~.routes.Routes`' plans.
Plans
    A driver runs a command's :class:`~..protocol.plans.Call` itself while
    its server is healthy (the hot path); otherwise, and for multi-key and
    whole-cluster commands, it drives the plans here (:meth:`Router.single`,
    :meth:`Router.fan_out`, :meth:`Router.each`), which yield the I/O of
    :mod:`.ops`: so both drivers route alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ..exceptions import CommandNotSupportedError, NodeUnavailableError
from ..ketama import Continuum
from ..keys import Key, Routed
from ..protocol.compiled import grouped
from ..protocol.plans import Call, Each, Exchange, FanOut, Forget
from ..protocol.wire import Get
from .gutter import clamp
from .health import Admission
from .journal import Journal, admit
from .node import Node
from .ops import FAILED, UNROUTED, NodePlan, Parallel, Refuse, Run, Target
from .replicas import request_key
from .routes import Routes

__all__ = ["Router", "remembered"]

ROUTES_KEPT = 8192  # ring bytes whose server is remembered (a few MB at most)


class Router:
    """A cluster's ring, servers and failover policy; shared by its views and async twin."""

    def __init__(
        self,
        ring: Continuum,
        nodes: Mapping[str, Node],
        gutter_nodes: Mapping[str, Node],
        locate: Callable[[bytes], str],
        remap: bool,
        routes: Routes | None,
        journal: Journal,
        known: dict[bytes, str] | None = None,
    ) -> None:
        self.ring = ring
        self.nodes = nodes
        self.gutter_nodes = gutter_nodes
        self.locate = locate  # the ring's server for a key's ring bytes (remembered)
        self.known = known if known is not None else {}  # what locate remembers
        self.only = next(iter(nodes)) if len(nodes) == 1 else None
        self.remap = remap
        self.routes = routes
        self.journal = journal

    def copies(self, kb: bytes, ring: bytes) -> int:
        """How many servers hold the key (1: not replicated)."""
        return self.routes.copies(kb, ring) if self.routes is not None else 1

    def pick(
        self, ring: bytes, primary: Node, admitted: dict[Node, Admission | None]
    ) -> tuple[Node, Admission] | None:
        """Choose the server for a key whose own server is failing, or None.

        ``"miss"``: its own server once the wait is over (this operation probes
        it).  ``"remap"``: the first server in ring order from the key that may
        be contacted.  ``admitted`` remembers each server's admission for the
        whole operation, so one multi-key call probes a server only once.
        """
        names = self.ring.get_nodes(ring, len(self.nodes)) if self.remap else (primary.name,)
        for name in names:
            node = self.nodes[name]
            if node not in admitted:
                admitted[node] = node.health.admit()
            admission = admitted[node]
            if admission is not None:
                return node, admission
        return None

    def group(
        self,
        given: Mapping[bytes, Key],
        owners: Mapping[bytes, str] | None,
        write: bool,
        strict: bool,
        everywhere: Mapping[bytes, bytes] | None = None,
    ) -> tuple[dict[Node, list[bytes]], dict[Node, list[bytes]], dict[Node, Admission]]:
        """Keys per server, with failover: ``(groups, skipped, admissions)``.

        Keys are grouped by their server first, so health is read once per
        server, not per key; a failing server's keys each go where the policy
        says (:meth:`pick`, then the gutter, never on the strict view), or are
        ``skipped``.  ``owners``: replicated keys, at the replica chosen for them.
        ``everywhere``: replicated keys written (key to ring bytes), to each of
        their replicas (:meth:`replicas_of`).
        """
        routes = self.routes
        gutter = routes is not None and routes.gutter_ring is not None and not strict
        groups: dict[Node, list[bytes]] = defaultdict(list)
        skipped: dict[Node, list[bytes]] = defaultdict(list)
        granted: dict[Node, Admission] = {}  # one admission per server contacted
        admitted: dict[Node, Admission | None] = {}  # what failing servers said (pick)
        if everywhere:  # replicated writes: to each replica, below
            given = {kb: key for kb, key in given.items() if kb not in everywhere}
        if self.only is not None:  # one server: every key is its
            owned = {self.only: list(given)}
        else:
            owned = grouped(given, self.locate, self.known)
        if owners:  # replicated keys: the replica chosen for this read instead
            owned = _reassigned(owned, owners)
        for name, kbs in owned.items():
            node = self.nodes[name]
            admission = granted.get(node) or node.health.open
            if admission is not None:
                granted.setdefault(node, admission)
                groups[node].extend(kbs)
                continue
            for kb in kbs:  # a failing server: each key goes where the policy says
                key = given[kb]
                picked = self.pick(key.route if type(key) is Routed else kb, node, admitted)
                if picked is None and gutter and type(key) is not Routed:
                    picked = routes.gutter_pick(node, kb, admitted, write)  # type: ignore[union-attr]
                if picked is None:
                    skipped[node].append(kb)
                    continue
                other, admission = picked
                granted.setdefault(other, admission)
                groups[other].append(kb)
        if everywhere:
            self.replicas_of(everywhere, groups, skipped, granted, admitted, gutter)
        return groups, skipped, granted

    def replicas_of(
        self,
        everywhere: Mapping[bytes, bytes],
        groups: dict[Node, list[bytes]],
        skipped: dict[Node, list[bytes]],
        granted: dict[Node, Admission],
        admitted: dict[Node, Admission | None],
        gutter: bool,
    ) -> None:
        """Group replicated keys being written on every replica (as Routes.write_replicas).

        A replica that cannot be used is journaled (it deletes the key before it
        serves again) and, under the gutter policy, its share goes to the key's
        gutter server; a key with nowhere to go is ``skipped``.
        """
        routes = self.routes
        assert routes is not None
        for kb, ring in everywhere.items():
            replicas = routes.replica_nodes(kb, ring)
            placed = False
            for node in replicas:
                admission = granted.get(node) or node.health.open
                if admission is None:
                    if node not in admitted:
                        admitted[node] = node.health.admit()
                    admission = admitted[node]
                if admission is not None:
                    granted.setdefault(node, admission)
                    groups[node].append(kb)
                    placed = True
                    continue
                routes.journal.missed(node.name, (kb,))
                if not gutter:
                    continue
                spare = routes.gutter_node(kb)
                if spare not in admitted:
                    admitted[spare] = granted.get(spare) or spare.health.admit()
                spare_admission = admitted[spare]
                if spare_admission is not None and kb not in groups[spare]:
                    granted.setdefault(spare, spare_admission)
                    groups[spare].append(kb)
                    placed = True
            if not placed:
                skipped[replicas[0]].append(kb)

    # -- plans --

    def single(self, call: Call[Any], strict: bool) -> NodePlan:
        """A Call whose server is not healthy, or under replicas or the gutter."""
        ring, request, decode, failed = call.ring, call.request, call.decode, call.failed
        routes = self.routes
        if routes is not None:
            kb = request_key(request)
            caller_gets = call.spread and type(request) is Get and request.cas
            if caller_gets and kb is not None and routes.copies(kb, ring) > 1:
                assert isinstance(request, Get)
                return (yield from routes.spread_tokens(kb, ring, request, decode, failed, strict))
            routed = yield from routes.single(ring, request, decode, failed, strict)
            if routed is not UNROUTED:
                return routed
        node = self.nodes[self.locate(ring)]
        admission = node.health.open
        if admission is None:
            admission = yield from admit(self.journal, node)  # repaired first, if it owes any
            if admission is None:
                picked = self.pick(ring, node, {node: None}) if self.remap else None
                if picked is None:
                    return (yield Refuse(node, failed, request))
                node, admission = picked
        result = yield Run(node, request, decode, admission, loud=True)
        return failed if result is FAILED else result

    def direct(self, op: FanOut[Any]) -> list[tuple[Target, list[bytes]]] | None:
        """``op``'s targets (with their keys) when routing has nothing to decide, else None.

        The hot path of multi-key commands: no replicas or gutter, no server owing
        repairs, every server of the keys healthy.  Then :meth:`fan_out`'s plan
        would only group the keys and send one parallel round trip; the driver
        sends it itself (a generator, its groups and failover maps cost a
        multi-key read several times a single get's instructions).
        """
        given = op.given
        if self.routes is not None or self.journal.dirty or not given:
            return None
        only = self.only
        owned = {only: list(given)} if only is not None else grouped(given, self.locate, self.known)
        exchange = op.exchange
        targets: list[tuple[Target, list[bytes]]] = []
        for name, kbs in owned.items():
            node = self.nodes[name]
            admission = node.health.open
            if admission is None:  # a failing server: fan_out's failover decides
                return None
            requests = tuple(exchange.requests(kbs))
            targets.append(((node, requests, admission, partial(exchange.result, kbs=kbs)), kbs))
        return targets

    def fan_out(self, op: FanOut[Any], strict: bool) -> NodePlan:
        """A multi-key command: group keys per server, send every request, read every reply.

        A server that fails only loses its own keys; errors for the caller are
        raised once every server's reply has been read, so no connection goes
        back to the pool mid-reply.  A replicated key read (``spread``) from a
        copy that answers "miss" is looked for on one more copy, all such keys
        in one more round trip; one written (``write``) goes to every replica
        in the same round trip as the other keys.
        """
        exchange, given, routes = op.exchange, op.given, self.routes
        if not given:
            return []
        owners = None
        for name in self.journal.dirty:  # servers that missed writes repair them first
            yield from admit(self.journal, self.nodes[name])
        everywhere: dict[bytes, bytes] = {}
        if routes is not None:
            owners = routes.spread(given) if op.spread else None
            if op.write:
                everywhere = routes.replicated_keys(given)
                if everywhere and strict:  # each alone: the strict view raises per key
                    return (yield from self.write_each(op, everywhere, strict))
        groups, skipped, granted = self.group(given, owners, op.write, strict, everywhere)
        gutter = routes.gutter_set if routes is not None and not strict else ()
        targets: list[Target] = []
        for node, kbs in groups.items():
            requests = tuple(exchange.requests(kbs))
            if node in gutter:
                requests = tuple(clamp(request, routes.gutter_ttl) for request in requests)  # type: ignore[union-attr]
            targets.append((node, requests, granted[node], partial(exchange.result, kbs=kbs)))
        results: list[Any] = []
        lost: set[str] = set()  # servers that failed this call (their spread keys are reread)
        try:
            answers = yield Parallel(targets, loud=True)
        except BaseException:  # failed, or the caller gave up: the copies may hold old values
            if everywhere:
                self.journal_written(groups, everywhere, None)
            raise
        answered: dict[str, Any] = {}
        for (node, kbs), answer in zip(groups.items(), answers, strict=True):
            if answer is FAILED:
                results.append(exchange.failed(kbs))
                lost.add(node.name)
            else:
                results.append(answer)
                answered[node.name] = answer
        for node, kbs in skipped.items():
            yield Refuse(node, None, tuple(exchange.requests(kbs)))  # the strict view raises
            results.append(exchange.failed(kbs))
            lost.add(node.name)
        if everywhere:
            self.journal_written(groups, everywhere, answers)
            return _merged(results, groups, everywhere)
        if owners and lost:  # a replica chosen for some keys just failed: the others answer
            for kb, name in owners.items():
                if name in lost:
                    results.append((yield from self.reread(exchange, given, kb, name, strict)))
        if owners:  # a copy that answered "miss" (restarted empty, evicted): ask one more
            missed = [
                kb
                for kb, name in owners.items()
                if type(answered.get(name)) is dict and kb not in answered[name]
            ]
            if missed:
                results.extend((yield from self.second_look(exchange, given, missed, owners)))
        return results

    def second_look(
        self,
        exchange: Exchange[Any],
        given: Mapping[bytes, Key],
        missed: list[bytes],
        owners: Mapping[bytes, str],
    ) -> NodePlan:
        """Read ``missed`` keys from another live copy each, in one parallel round trip.

        A copy that fails now is a miss, as the first copy said (quiet: the
        strict view does not raise for it).
        """
        assert self.routes is not None
        groups: dict[Node, list[bytes]] = defaultdict(list)
        for kb in missed:
            key = given[kb]
            node = self.routes.another(kb, key.route if type(key) is Routed else kb, owners[kb])
            if node is not None:
                groups[node].append(kb)
        targets: list[Target] = []
        for node, kbs in groups.items():
            admission = node.health.open
            if admission is not None:
                requests = tuple(exchange.requests(kbs))
                targets.append((node, requests, admission, partial(exchange.result, kbs=kbs)))
        if not targets:
            return []
        answers = yield Parallel(targets)
        return [answer for answer in answers if answer is not FAILED]

    def write_each(
        self, op: FanOut[Any], everywhere: Mapping[bytes, bytes], strict: bool
    ) -> NodePlan:
        """The strict view's multi-key write: each replicated key alone (it raises when no
        replica answered), then the other keys fanned out."""
        assert self.routes is not None
        exchange = op.exchange
        results: list[Any] = []
        for kb, ring in everywhere.items():
            (request,) = exchange.requests([kb])
            decode = partial(_one, exchange, kb)
            failed = exchange.failed([kb])
            results.append(
                (yield from self.routes.replicated(kb, ring, request, decode, failed, strict))
            )
        rest = {kb: key for kb, key in op.given.items() if kb not in everywhere}
        if rest:
            results.extend((yield from self.fan_out(FanOut(exchange, rest, write=True), strict)))
        return results

    def journal_written(
        self,
        groups: Mapping[Node, list[bytes]],
        everywhere: Mapping[bytes, bytes],
        answers: list[Any] | None,
    ) -> None:
        """Journal the replicas whose write of a replicated key failed (None: all of them,
        the write abandoned mid-way): they delete it before they serve again."""
        routes = self.routes
        assert routes is not None
        gutter = routes.gutter_set
        replies = answers if answers is not None else [FAILED] * len(groups)
        for (node, kbs), answer in zip(groups.items(), replies, strict=True):
            if answer is FAILED and node not in gutter:
                routes.journal.missed(node.name, [kb for kb in kbs if kb in everywhere])

    def reread(
        self,
        exchange: Exchange[Any],
        given: Mapping[bytes, Key],
        kb: bytes,
        avoid: str,
        strict: bool,
    ) -> NodePlan:
        """``kb`` read from its replicas other than ``avoid`` (which failed in this multi-get)."""
        assert self.routes is not None
        (request,) = exchange.requests([kb])
        decode = partial(_one, exchange, kb)
        failed = exchange.failed([kb])
        key = given[kb]
        ring = key.route if type(key) is Routed else kb
        return (yield from self.routes.reread(kb, ring, avoid, request, decode, failed, strict))

    def each(self, op: Each[Any], strict: bool) -> NodePlan:
        """``op.request`` on every server (and the gutter's), one after another, by node name."""
        if op.only_gutter:
            nodes = list(self.gutter_nodes.values())
        else:
            nodes = [*self.nodes.values(), *(self.gutter_nodes.values() if op.gutter else ())]
        found: dict[str, Any] = {}
        for node in nodes:
            admission = yield from admit(self.journal, node)
            try:
                if admission is None:
                    result = yield Refuse(node, op.failed, op.request)
                else:
                    result = yield Run(node, op.request, op.decode, admission, loud=True)
            except (NodeUnavailableError, CommandNotSupportedError):
                if op.tolerant:
                    continue  # down, or a proxy that does not pass it (twemproxy)
                raise
            if result is FAILED:
                result = op.failed
            if op.tolerant and result is None:
                continue
            found[node.name] = result
        return found

    def repair(self) -> NodePlan:
        """Replay the journal of every server that owes repairs and may be contacted now."""
        for name in list(self.journal.dirty):
            yield from admit(self.journal, self.nodes[name])

    def forget(self, op: Forget) -> NodePlan:
        """Run ``op``'s repair on its key's server now, or journal it there (True: now)."""
        kb, ring, routes = op.kb, op.ring, self.routes
        if routes is not None and routes.copies(kb, ring) > 1:  # every copy, journaled as it goes
            result = yield from routes.single(ring, op.request, _landed, FAILED, False)
            return result is True
        node = self.nodes[self.locate(ring)]
        admission = node.health.open
        if admission is None:
            admission = yield from admit(self.journal, node)
        if admission is not None and (yield Run(node, op.request, _landed, admission)) is True:
            return True
        self.journal.record(node.name, kb, op.request)
        return False

    def home_token(self, kb: bytes, token: Any) -> NodePlan:
        """The home's cas token while it holds the item a copy's token came with, else None."""
        if self.routes is None:
            return None
        return (yield from self.routes.home_token(kb, token))


def _landed(reply: Any) -> bool:
    """Any reply: the server ran the request (deleted, not found, stored)."""
    return True


def _one(exchange: Exchange[Any], kb: bytes, reply: Any) -> Any:
    return exchange.result([reply], [kb])


def _merged(
    results: list[Any], groups: Mapping[Node, list[bytes]], everywhere: Mapping[bytes, bytes]
) -> list[Any]:
    """A write's per-server results with each replicated key failed only where it failed on
    every server it went to (a list result names the keys not stored)."""
    went: dict[bytes, int] = defaultdict(int)
    for kbs in groups.values():
        for kb in kbs:
            if kb in everywhere:
                went[kb] += 1
    failing: dict[bytes, int] = defaultdict(int)
    for part in results:
        if type(part) is list:
            for kb in part:
                failing[kb] += 1
    stored = {kb for kb, n in went.items() if failing[kb] < n}
    merged: list[Any] = []
    seen: set[bytes] = set()
    for part in results:
        if type(part) is list:
            part = [kb for kb in part if kb not in stored and kb not in seen]
            seen.update(part)
        merged.append(part)
    return merged


def _reassigned(
    owned: dict[str, list[bytes]], owners: Mapping[bytes, str]
) -> dict[str, list[bytes]]:
    """Keys per server, with each key of ``owners`` moved to the server named there."""
    moved: dict[str, list[bytes]] = defaultdict(list)
    for name, kbs in owned.items():
        for kb in kbs:
            moved[owners.get(kb, name)].append(kb)
    return moved


def remembered(
    ring_node: Callable[[bytes], str], routes: dict[bytes, str] | None = None
) -> Callable[[bytes], str]:
    """``ring_node``, remembered: the server of the bytes a key is placed by.

    Hot keys come back all the time and their server never changes (the
    cluster's ring is fixed), so they skip the MD5 and the ring search: a dict
    lookup instead.  The ring bytes are a plain key's own or a route
    (:func:`~..keys.placed`), and the ring maps bytes, whichever they are.  Past
    :data:`ROUTES_KEPT` entries the memory starts over.  ``routes``: the dict it
    remembers in (read directly by :meth:`Router.group`).
    """
    if routes is None:
        routes = {}

    def locate(ring: bytes) -> str:
        node = routes.get(ring)
        if node is None:
            if len(routes) >= ROUTES_KEPT:
                routes.clear()
            node = routes[ring] = ring_node(ring)
        return node

    return locate
