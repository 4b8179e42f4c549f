"""The compiled hot path, when it is built: one place decides whether it runs.

The protocol layer's hot path exists twice, with the same answers: in Python
(:class:`~.reader.Reader`, the requests' ``encode`` methods, the sync
transport's socket calls) and in C (``_speedups``, built from ``src/speedups/``
where a compiler exists).  The C :class:`Reader` parses as the Python one does
(a hypothesis test feeds both the same byte streams split at random points)
and adds the sync transport's I/O on a blocking socket: a request is encoded,
sent, received and its reply scanned with the GIL released once, so threads
sharing a cluster overlap there as pylibmc's do.

``DJANGO_MCPATTERNS_PURE_PYTHON=1`` (read at import) runs the pure-Python path
even where the compiled one is built (CI runs the contract suites on both).

:data:`COMPILED`
    Whether the compiled path runs in this process.
:data:`Reader`
    The reader connections use: the compiled one, else the Python one.
:func:`encode`
    The bytes of a batch of requests, written at once.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from ..exceptions import ProtocolError
from . import reader
from .wire import NEED_DATA, ErrorReply, Get, MetaReply, Request, Store, Value
from .wire import encode as encode_in_python

__all__ = [
    "COMPILED",
    "PURE_SWITCH",
    "ConnectionClosedError",
    "Reader",
    "encode",
    "load",
    "why_pure",
]

PURE_SWITCH = "DJANGO_MCPATTERNS_PURE_PYTHON"
ABI = 1  # what this module expects of _speedups (its ABI constant)

why_pure = ""  # why the pure-Python path runs, when it does


class ConnectionClosedError(ConnectionError):
    """The server closed the connection before its reply was complete.

    Raised by both transports (and the compiled I/O, hence its place here).
    """


def load() -> ModuleType | None:
    """The compiled module, bound to this package's classes; None where it cannot run."""
    global why_pure
    if os.environ.get(PURE_SWITCH, "") not in ("", "0"):
        why_pure = f"{PURE_SWITCH} is set"
        return None
    try:
        module = importlib.import_module(f"{__package__}._speedups")
    except ImportError as exc:
        why_pure = f"not built ({exc})"
        return None
    if getattr(module, "ABI", None) != ABI:
        why_pure = f"built from other sources (ABI {getattr(module, 'ABI', None)}, not {ABI})"
        return None
    module.bind(
        ProtocolError=ProtocolError,
        ConnectionClosedError=ConnectionClosedError,
        ErrorReply=ErrorReply,
        MetaReply=MetaReply,
        Value=Value,
        NEED_DATA=NEED_DATA,
        Get=Get,
        Store=Store,
    )
    return module


speedups = load()
COMPILED = speedups is not None
Reader: Any = speedups.Reader if speedups is not None else reader.Reader


def encode(requests: Sequence[Request[Any]] | Iterable[Request[Any]]) -> bytes:
    """The bytes of a batch of requests (:func:`.wire.encode`, in C when compiled)."""
    if speedups is not None:
        data: bytes = speedups.encode(
            requests if isinstance(requests, Sequence) else list(requests)
        )
        return data
    return encode_in_python(requests)
