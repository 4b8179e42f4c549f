"""Where a command on a replicated key, or a dead server's key, goes: written once, as plans.

The decisions are :mod:`.replicas` (which servers hold a key, what each command
does to them, the journal of missed writes) and :mod:`.gutter` (what the
gutter pool takes, with which TTL).  :class:`Routes` combines them with node
health into *plans*: generators that yield the I/O they need as ops
(:mod:`.ops`: ``Run``, ``Parallel``, ``Refuse``) and receive each op's
result; each driver performs them with its round-trip primitive, so the sync
and the async cluster route alike.  A driver throws an op's exception into
the plan, so a plan cleans up (journals copies a write may have missed) on
any failure, a caller's cancellation included.
Plans are driven by the view that started them: ``strict`` says whether it is
the strict one (:meth:`Cluster.strict`), which raises where the default view
degrades and never uses the gutter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import NodeUnavailableError, OutcomeUnknownError, ReplicatedKeyError
from ..ketama import Continuum
from ..keys import Key, Routed
from ..protocol.plans import CopyToken
from ..protocol.wire import Delete, Get, Request, Value
from ..values.layout import CHUNK_PREFIX
from .gutter import allowed as gutter_allows
from .gutter import clamp
from .health import Admission
from .journal import Journal, admit
from .node import Node
from .ops import FAILED, UNROUTED, Decode, NodePlan, Parallel, Refuse, Requests, Run, Target
from .replicas import (
    Fate,
    ReplicaPolicy,
    changed,
    copy_tokens,
    fate,
    is_write,
    mirror,
    mirrored_batch,
    request_key,
)

__all__ = ["Routes"]

Plan = NodePlan


class Routes:
    """A cluster's replicated prefixes, gutter pool and journal, and the plans that use them."""

    def __init__(
        self,
        *,
        ring: Continuum,
        nodes: Mapping[str, Node],
        locate: Callable[[bytes], str],
        policy: ReplicaPolicy | None,
        gutter_ring: Continuum | None,
        gutter_nodes: Mapping[str, Node],
        gutter_ttl: int,
        rng: Callable[[], float],
        journal: Journal,
    ) -> None:
        self.ring = ring
        self.nodes = nodes
        self.locate = locate
        self.policy = policy
        self.gutter_ring = gutter_ring
        self.gutter_nodes = gutter_nodes
        self.gutter_set = frozenset(gutter_nodes.values())
        self.gutter_ttl = gutter_ttl
        self.rng = rng
        self.journal = journal

    # -- decisions without I/O --

    def copies(self, kb: bytes, ring: bytes) -> int:
        """How many servers hold the key (1: not replicated).

        A key routed by another (a namespace's, placed by its root) is never
        replicated, except a value's chunks, which follow the value's replicas
        (``ring`` is the value's key): a manifest is readable wherever its
        chunks are.
        """
        policy = self.policy
        if policy is None:
            return 1
        if kb == ring:
            return policy.copies(kb)
        return policy.copies(ring) if kb.startswith(CHUNK_PREFIX) else 1

    def replicated_keys(self, given: Mapping[bytes, Key]) -> dict[bytes, bytes]:
        """The keys of ``given`` kept on several servers, each with the bytes placing them."""
        if self.policy is None:
            return {}
        found: dict[bytes, bytes] = {}
        for kb, key in given.items():
            ring = key.route if type(key) is Routed else kb
            if self.copies(kb, ring) > 1:
                found[kb] = ring
        return found

    def replica_nodes(self, kb: bytes, ring: bytes) -> list[Node]:
        """The servers holding a replicated key, its home first."""
        return [self.nodes[name] for name in self.ring.get_nodes(ring, self.copies(kb, ring))]

    def spread(self, given: Mapping[bytes, Key]) -> dict[bytes, str] | None:
        """For a multi-get: a live replica chosen at random for each replicated key."""
        chosen: dict[bytes, str] = {}
        for kb, ring in self.replicated_keys(given).items():
            live = [n for n in self.replica_nodes(kb, ring) if n.health.open is not None]
            if live:
                chosen[kb] = live[int(self.rng() * len(live)) % len(live)].name
        return chosen or None

    def another(self, kb: bytes, ring: bytes, avoid: str) -> Node | None:
        """A live replica of ``kb`` other than ``avoid``, chosen at random (a second look)."""
        live = [
            n for n in self.replica_nodes(kb, ring) if n.name != avoid and n.health.open is not None
        ]
        return live[int(self.rng() * len(live)) % len(live)] if live else None

    def gutter_node(self, kb: bytes) -> Node:
        assert self.gutter_ring is not None
        return self.gutter_nodes[self.gutter_ring.get_node(kb)]

    def gutter_pick(
        self, dead: Node, kb: bytes, admitted: dict[Node, Admission | None], write: bool
    ) -> tuple[Node, Admission] | None:
        """For a multi-key command: ``kb``'s gutter server while its own cannot be used."""
        node = self.gutter_node(kb)
        if node not in admitted:
            admitted[node] = node.health.admit()
        admission = admitted[node]
        if admission is None:
            return None
        if write:
            self.journal.missed(dead.name, (kb,))
        return node, admission

    def clamped(self, request: Requests) -> Requests:
        ttl = self.gutter_ttl
        if isinstance(request, tuple):
            return tuple(clamp(r, ttl) for r in request)
        return clamp(request, ttl)

    # -- plans --

    def admit(self, node: Node) -> Plan:
        """Leave to use ``node`` (NodeHealth.admit), after it replayed the writes it missed."""
        return (yield from admit(self.journal, node))

    def single(
        self, ring: bytes, request: Requests, decode: Decode, failed: Any, strict: bool
    ) -> Plan:
        """A single-key command: replicated, or under the gutter policy; else :data:`UNROUTED`."""
        kb = request_key(request)
        if kb is not None and self.copies(kb, ring) > 1:
            return (yield from self.replicated(kb, ring, request, decode, failed, strict))
        if self.gutter_ring is None:
            return UNROUTED
        node = self.nodes[self.locate(ring)]
        admission = yield from self.admit(node)
        if admission is not None:
            result = yield Run(node, request, decode, admission, loud=True)  # strict raises
            if result is not FAILED:
                return result
        elif strict:
            return (yield Refuse(node, failed))  # locks (the strict view) never use the gutter
        if kb is None or kb != ring or not gutter_allows(request):
            return failed  # namespaced keys and in-place edits fail as under "miss"
        if is_write(request):
            self.journal.missed(node.name, (kb,))
        return (yield from self.in_gutter(kb, request, decode, failed))

    def in_gutter(self, kb: bytes, request: Requests, decode: Decode, failed: Any) -> Plan:
        """Run ``request`` on ``kb``'s gutter server, every TTL clamped to ``gutter_ttl``."""
        node = self.gutter_node(kb)
        admission = node.health.admit()
        if admission is None:
            return failed
        result = yield Run(node, self.clamped(request), decode, admission)
        return failed if result is FAILED else result

    def replicated(
        self, kb: bytes, ring: bytes, request: Requests, decode: Decode, failed: Any, strict: bool
    ) -> Plan:
        """A command on a replicated key, where :func:`~.replicas.fate` says."""
        where = fate(request)
        if where is Fate.REFUSED:
            first = request[0] if isinstance(request, tuple) else request
            verb = first.encode().split(maxsplit=1)[0].decode("ascii")
            raise ReplicatedKeyError(
                f"{verb} of {kb!r}: the key is under an OPTIONS['replicate'] prefix, and "
                "in-place edits (append, prepend, incr, decr) are not replicated; keep sets, "
                "lists, counters and namespaces outside replicated prefixes",
                option="replicate",
            )
        nodes = self.replica_nodes(kb, ring)
        if where is Fate.READ:
            return (yield from self.read_replica(kb, nodes, request, decode, failed, strict))
        if where is Fate.EVERYWHERE:
            assert not isinstance(request, tuple)
            return (yield from self.write_replicas(kb, nodes, request, decode, failed, strict))
        return (yield from self.at_home(kb, nodes, request, decode, failed, where, strict))

    def spread_tokens(
        self, kb: bytes, ring: bytes, request: Get, decode: Decode, failed: Any, strict: bool
    ) -> Plan:
        """A caller's ``gets`` of a replicated key: spread as a ``get``; copies' tokens marked."""
        nodes = self.replica_nodes(kb, ring)
        return (yield from self.read_replica(kb, nodes, request, decode, failed, strict, True))

    def home_token(self, kb: bytes, token: CopyToken) -> Plan:
        """The home's cas token while it holds the item ``token`` was read with; else None."""
        home = self.nodes[self.locate(kb)]
        admission = yield from self.admit(home)
        if admission is None:
            return None
        item = yield Run(home, Get((kb,), cas=True), _first_item, admission)
        if item is FAILED or item is None or (item.data, item.flags) != (token.data, token.flags):
            return None
        return item.cas

    def reread(
        self,
        kb: bytes,
        ring: bytes,
        avoid: str,
        request: Requests,
        decode: Decode,
        failed: Any,
        strict: bool,
    ) -> Plan:
        """A replicated key whose replica chosen for a multi-get failed: read from the others."""
        nodes = [node for node in self.replica_nodes(kb, ring) if node.name != avoid]
        return (yield from self.read_replica(kb, nodes, request, decode, failed, strict))

    def read_replica(
        self,
        kb: bytes,
        nodes: list[Node],
        request: Requests,
        decode: Decode,
        failed: Any,
        strict: bool,
        mark: bool = False,
    ) -> Plan:
        """Read from one live replica chosen at random; a miss there is checked on one more.

        ``mark``: the cas tokens of copies (not the home) become CopyTokens.
        """
        order = list(nodes)
        for i in range(len(order) - 1, 0, -1):  # Fisher-Yates on the injected rng
            j = int(self.rng() * (i + 1)) % (i + 1)
            order[i], order[j] = order[j], order[i]
        missed: Any = FAILED
        seen: list[Any] = []

        def peek(reply: Any) -> Any:
            seen.append(reply)
            return reply if decode is None else decode(reply)

        def marked(reply: Any) -> Any:
            return peek(copy_tokens(reply))

        for node in order:
            admission = yield from self.admit(node)
            if admission is None:
                continue
            seen.clear()
            read = marked if mark and node is not nodes[0] else peek
            result = yield Run(node, request, read, admission)
            if result is FAILED:
                continue
            if seen and seen[0] == [] and missed is FAILED:
                missed = result  # a miss on one copy (evicted, or replayed): ask one more
                continue
            return result
        if missed is not FAILED:
            return missed
        if strict:
            raise NodeUnavailableError(
                f"no replica of {kb!r} could be read ({', '.join(n.name for n in nodes)})",
                node=nodes[0].name,
            )
        if self.gutter_ring is not None:
            return (yield from self.in_gutter(kb, request, decode, failed))
        return failed

    def write_replicas(
        self,
        kb: bytes,
        nodes: list[Node],
        request: Request[Any],
        decode: Decode,
        failed: Any,
        strict: bool,
    ) -> Plan:
        """Send a write to every replica in one parallel round trip; journal those that missed it.

        A dead replica's share goes to the gutter under the gutter policy.
        The answer is the first replica's that stored (deleted, touched), else
        the first answer; none (every replica failed) is ``failed``.
        """
        targets: list[Target] = []
        missed: list[Node] = []
        for node in nodes:
            admission = yield from self.admit(node)
            if admission is not None:
                targets.append((node, request, admission, decode))
                continue
            missed.append(node)
            if self.gutter_ring is not None and not strict:
                spare = self.gutter_node(kb)
                spare_admission = spare.health.admit()
                if spare_admission is not None and all(t[0] is not spare for t in targets):
                    clamped = clamp(request, self.gutter_ttl)
                    targets.append((spare, clamped, spare_admission, decode))
        try:
            results = yield Parallel(targets, together=True)
        except BaseException:  # failed, or the caller gave up (cancelled), with the write in flight
            self.abandoned(kb, [t[0] for t in targets if t[0] not in self.gutter_set] + missed)
            raise
        for (node, *_), result in zip(targets, results, strict=True):
            if result is FAILED and node not in self.gutter_set:
                missed.append(node)
        for node in missed:
            self.journal.missed(node.name, (kb,))
        answers = [r for r in results if r is not FAILED]
        if not answers:
            if strict:
                raise OutcomeUnknownError(
                    f"no replica of {kb!r} answered ({', '.join(n.name for n in nodes)})",
                    node=nodes[0].name,
                )
            return failed
        return next((answer for answer in answers if answer), answers[0])

    def at_home(
        self,
        kb: bytes,
        nodes: list[Node],
        request: Requests,
        decode: Decode,
        failed: Any,
        where: Fate,
        strict: bool,
    ) -> Plan:
        """Run on the key's home, then bring the copies in line (see replicas.py).

        A token read (``gets``) goes to a live copy while the home cannot be
        used; its tokens are :class:`~.replicas.CopyToken`.
        """
        home, copies = nodes[0], nodes[1:]
        seen: list[Any] = []

        def peek(reply: Any) -> Any:
            seen.append(reply)
            return reply if decode is None else decode(reply)

        admission = yield from self.admit(home)
        result: Any = FAILED
        try:
            if admission is not None:
                if isinstance(request, tuple):  # a batch answers its replies as they are
                    result = yield Run(home, request, None, admission)
                    seen.append(result)
                else:
                    result = yield Run(home, request, peek, admission)
        except BaseException:  # cancelled: the home may run it, the copies never hear of it
            if is_write(request):
                self.abandoned(kb, copies)
            raise
        if where is Fate.TOKEN_READ:
            if result is FAILED and isinstance(request, Get):
                return (yield from self.read_copy(copies, request, decode, failed, home))
            if result is FAILED:
                return (yield Refuse(home, failed))
            return result
        if result is FAILED:
            if admission is not None and is_write(request):
                # Applied on the home or not: unknown, so the copies cannot be trusted.
                try:
                    yield from self.write_replicas(kb, copies, Delete(kb), None, None, False)
                except BaseException:
                    self.abandoned(kb, copies)
                    raise
            return (yield Refuse(home, failed))
        if seen and changed(seen[0]):
            if isinstance(request, tuple):  # text add_cas/recas: a store, then its gets
                stored = mirrored_batch(request, seen[0])
            else:
                stored = mirror(request) if where is Fate.HOME_THEN_MIRROR else None
            copy: Request[Any] = stored or Delete(kb)  # the value, else no value
            try:
                yield from self.write_replicas(kb, copies, copy, None, None, False)
            except BaseException:  # cancelled before every copy was brought in line
                self.abandoned(kb, copies)
                raise
        return result

    def abandoned(self, kb: bytes, nodes: list[Node]) -> None:
        """A plan closed mid-write (its caller cancelled): ``nodes`` may hold ``kb``'s old value.

        The driver throws the caller's exception (or GeneratorExit) into the
        plan at its yield; those copies are journaled, so they are deleted
        before they serve again.
        """
        for node in nodes:
            self.journal.missed(node.name, (kb,))

    def read_copy(
        self, copies: list[Node], request: Get, decode: Decode, failed: Any, home: Node
    ) -> Plan:
        """A ``gets`` answered by a live copy: its tokens are marked as a copy's."""

        def marked(reply: Any) -> Any:
            reply = copy_tokens(reply)
            return reply if decode is None else decode(reply)

        for node in copies:
            admission = yield from self.admit(node)
            if admission is None:
                continue
            result = yield Run(node, request, marked, admission)
            if result is not FAILED:
                return result
        return (yield Refuse(home, failed))


def _first_item(reply: Any) -> Value | None:
    return reply[0] if type(reply) is list and reply else None
