"""The I/O a routing plan asks a driver for, server by server (sans-IO: data only).

Routing plans (:mod:`.routing`, :mod:`.routes`) turn a command's ops (a key's
:class:`~..protocol.plans.Call`, a multi-key fan-out...) into these, naming
the server and the admission its health gave; each driver performs them with
its one round-trip primitive: :class:`Run` is one round trip, :class:`Parallel`
several written before any reply is read, :class:`Refuse` none.

A :data:`FAILED` result is a server that could not be used (never a value).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeAlias

from ..protocol.wire import Request
from .health import Admission
from .node import Node

__all__ = [
    "FAILED",
    "UNROUTED",
    "Decode",
    "NodePlan",
    "Parallel",
    "Refuse",
    "Requests",
    "Run",
    "Target",
]

FAILED: Any = object()  # the server could not be used (a failure, not a value)
UNROUTED: Any = object()  # Routes.single: neither replicated nor for the gutter

Requests: TypeAlias = "Request[Any] | tuple[Request[Any], ...]"
Decode: TypeAlias = "Callable[[Any], Any] | None"
NodePlan: TypeAlias = Generator[Any, Any, Any]


class Run:
    """Run ``request`` on ``node``; a server failure answers :data:`FAILED`.

    ``loud``: as the driving view's own commands do instead (the strict view
    raises :class:`~..exceptions.NodeUnavailableError`).
    """

    __slots__ = ("admission", "decode", "loud", "node", "request")

    def __init__(
        self,
        node: Node,
        request: Requests,
        decode: Decode,
        admission: Admission,
        loud: bool = False,
    ) -> None:
        self.node = node
        self.request = request
        self.decode = decode
        self.admission = admission
        self.loud = loud


# One server's part of a Parallel: ``(node, request(s), admission, decoder)`` (a tuple:
# a fan-out makes one per server).
Target: TypeAlias = "tuple[Node, Requests, Admission, Decode]"


class Parallel:
    """Send every target its request, then read every reply; a result (or FAILED) each.

    An error for the caller is raised once every reply has been read, so no
    connection is left mid-reply; ``loud``: the strict view's server failures
    are such errors too (a fan-out), where otherwise they are FAILED (replicas).
    ``together``: the replies are waited for together, a stalled server costing
    one timeout for all (a replicated write: a few servers, a selector's
    system calls); otherwise each in turn (a fan-out: no system call beyond
    each server's send and receive).
    """

    __slots__ = ("loud", "targets", "together")

    def __init__(self, targets: list[Target], loud: bool = False, together: bool = False) -> None:
        self.targets = targets
        self.loud = loud
        self.together = together


class Refuse:
    """``node`` cannot be used: the view answers ``failed`` or raises (strict).

    ``request``: what was not sent, reported to the observer as skipped.
    """

    __slots__ = ("failed", "node", "request")

    def __init__(self, node: Node, failed: Any, request: Requests | None = None) -> None:
        self.node = node
        self.failed = failed
        self.request = request
