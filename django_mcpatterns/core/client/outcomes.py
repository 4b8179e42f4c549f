"""What a round trip's failure means: the judgments both drivers' primitives share.

Three outcomes of a write
    A failure before anything was sent (no connection) certainly changed
    nothing; once the connection is up, a failure may follow a command that
    memcached applied.  The strict view raises :class:`OutcomeUnknownError`
    for those (a :class:`NodeUnavailableError`), so rewriters can tell "not
    stored" from "unknown" (:mod:`..store`); the default view answers both
    ``False``, as Django's backends do.
Server failures and the caller's errors
    Socket errors, timeouts, closed connections and replies out of step
    (:data:`NODE_ERRORS`) are the server's: recorded in its
    :class:`~.health.NodeHealth`, which applies the failover policy.
    memcached's error replies are the caller's (``ValueTooLargeError``, ...):
    the server answered, and its health is untouched.
Refusals
    A server that does not know a command (a meta command on memcached before
    1.6 answers ``ERROR``; twemproxy closes the connection) is a setting, not
    a failing server: :func:`refusal_seen` tells, and the driver asks again on
    fresh connections when the answer was a closed connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..exceptions import (
    CommandNotSupportedError,
    NodeUnavailableError,
    OutcomeUnknownError,
    ProtocolError,
)
from ..observe import Observer
from ..protocol.meta import MetaNoop
from ..protocol.replies import META_REQUESTS, REFUSABLE, UnknownCommandError, not_supported
from ..protocol.wire import Request
from .health import Admission
from .node import Node
from .transport import ConnectionClosedError

__all__ = [
    "NODE_ERRORS",
    "Listeners",
    "answered",
    "judge",
    "probe_for",
    "refusal_seen",
    "unavailable",
]

logger = logging.getLogger("django_mcpatterns.cluster")

E = TypeVar("E")

# What a dead, hung or restarted server looks like from here: refused or reset
# connections, timeouts and connections closed mid-reply (all OSError), or a
# reply that does not answer the request.
NODE_ERRORS = (OSError, ProtocolError)


def judge(
    node: Node, exc: BaseException, admission: Admission, sent: bool, strict: bool
) -> BaseException | None:
    """Settle a round trip that raised ``exc``: record what it says about the server.

    Return the exception for the caller, or None when the view degrades (the
    command answers its failure value).  ``sent``: the command may have left,
    so its outcome is unknown.  The driver has already dealt with its
    connection (never reused after a failure).
    """
    if isinstance(exc, NODE_ERRORS):
        node.health.failed(exc, admission)
        return unavailable(node, exc, unknown=sent) if strict else None
    if admission.probe:
        node.health.released()
    return exc


def answered(node: Node, observer: Observer | None, admission: Admission) -> None:
    """A round trip admitted with ``admission`` was answered: a failing server may be up again.

    Only an answer to a request admitted since the latest failure (a probe)
    proves it: one admitted before may have been read before the failure and
    judged after it (another thread's), which would end an outage that goes
    on, and log it back and out again.  Idle connections are dropped first:
    one a request released after the failure may predate the outage (a
    killed server's), and would fail again.
    """
    if node.health.failures and node.health.current(admission):
        node.drop_idle()
        node.health.succeeded()
        if observer is not None:
            observer.server_state(node.name, True)


def unavailable(
    node: Node, exc: BaseException | None, *, unknown: bool = False
) -> NodeUnavailableError:
    """The strict view's error for ``node``: unavailable, or the outcome unknown (``unknown``).

    ``exc`` None: the server was not contacted (in its retry or dead wait).
    """
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
    error = kind(f"memcached server {node.name} is unavailable ({detail}){outcome}", node=node.name)
    error.__cause__ = exc
    return error


def refusal_seen(
    name: str, batch: tuple[Request[Any], ...], exc: BaseException
) -> tuple[CommandNotSupportedError | None, Request[Any] | None]:
    """What ``exc`` says of a command server ``name`` may not know, before any probe.

    ``(error, None)``: it answered ``ERROR`` (certain); ``(None, command)``: it
    closed the connection, so ask again (:func:`probe_for`); ``(None, None)``:
    no refusal, the server is failing.
    """
    refused = next((r for r in batch if isinstance(r, REFUSABLE)), None)
    if refused is None:
        return None, None
    if isinstance(exc, UnknownCommandError):
        return not_supported(name, refused, "answered ERROR to"), None
    if not isinstance(exc, ConnectionClosedError):
        return None, None
    return None, refused


def probe_for(refused: Request[Any]) -> Request[Any]:
    """What to ask again on a fresh connection: ``mn`` for a meta command, else the command.

    The same refusal while ``version`` is answered means the server is up and
    does not know the command (twemproxy); otherwise the server is failing.
    """
    return MetaNoop() if isinstance(refused, META_REQUESTS) else refused


class Listeners(Generic[E]):
    """Callables told of each event, each added once; one that fails is logged, not raised.

    Shared by a cluster, its strict view and its async twin; adding swaps in
    a new tuple, so telling needs no lock.
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
