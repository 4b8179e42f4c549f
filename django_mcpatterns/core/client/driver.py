"""What both drivers are besides their I/O: a view of one cluster's shared state.

:class:`Driver` is the base of :class:`~.cluster.Cluster` and
:class:`~.aio.AsyncCluster`: the Store commands (:mod:`..protocol.commands`),
the servers, options and serde they answer with, and the introspection both
offer (health, listeners, replicas, the journal).  A driver subclass adds one
thing: how it runs a plan (``run``), with its round-trip primitive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..keys import Key, placed
from ..observe import Observer
from ..protocol.commands import StoreCommands
from ..values.refusals import ValueRefused
from .health import HealthSnapshot, NodeEvent
from .node import Node
from .ops import Requests
from .options import ClusterOptions
from .outcomes import unavailable
from .shared import Shared

__all__ = ["Driver"]


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

    def __repr__(self) -> str:
        nodes = ", ".join(self._nodes)
        return f"<{type(self).__name__} {nodes} ketama={self.options.ketama}>"

    @property
    def observer(self) -> Observer | None:
        """The observer of this cluster (its views' and twin's too), or None (not observed)."""
        return self.shared.observer

    def copies(self, kb: bytes, ring: bytes) -> int:
        return self.router.copies(kb, ring)

    def replicated_keys(self, given: Mapping[bytes, Key]) -> list[bytes]:
        routes = self._routes
        return routes.replicated_keys(given) if routes is not None else []

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
