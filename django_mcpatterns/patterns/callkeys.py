"""Cache keys for function calls: the same in every process, always valid memcached keys.

A decorated function's value is cached under a key made of the function's
qualified name and its arguments.  ``repr()`` will not do: objects print their
memory address, so every process (and every call) would get its own key.
:func:`encode` writes arguments as canonical text instead, type by type, and
refuses the types it cannot write stably, so an argument never silently turns
into a key that never hits (or, worse, a key another argument shares).

The key is readable when it can be, ``module.function(2024,"eu")``, and
``module.function#<digest>`` when the text is long or holds characters
memcached refuses (whitespace, control characters; non-ASCII text is
``\\u``-escaped first).  Both stay far enough under memcached's 250 bytes for
the backend's ``KEY_PREFIX`` and ``VERSION``.

Framework-free: Django model instances are recognised by duck typing
(``_meta.label_lower`` and ``pk``).  Any other object says how it is keyed with
a ``__cache_key__()`` method returning a value :func:`encode` writes (an id, a
tuple of fields): that is how a decorated method's ``self`` gets into its key.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_READABLE", "call_key", "encode"]

# Readable keys up to this many characters; memcached allows 250 bytes, and the
# backend adds KEY_PREFIX and ":<VERSION>:" to the key.
MAX_READABLE = 200
_DIGEST_CHARS = 32  # 128 bits of SHA-256: collisions are not a practical concern
_TEMPORAL = (datetime.datetime, datetime.date, datetime.time)


def encode(value: Any) -> str:
    """Return canonical text for ``value``; equal arguments of one type give equal text.

    Types are told apart (``1``, ``1.0``, ``True`` and ``"1"`` give four
    texts), dicts and sets are sorted, Django model instances are written as
    their label and primary key, and an object with a ``__cache_key__()``
    method as its class and what that returns.  Raise :class:`TypeError` for
    anything else: give the decorator a ``key=`` callable for such arguments.
    """
    for kind, writer in _WRITERS:
        if isinstance(value, kind):
            return writer(value)
    own = getattr(type(value), "__cache_key__", None)
    if own is not None:
        return f"{_qualified(type(value))}:{encode(own(value))}"
    meta = getattr(value, "_meta", None)
    if meta is not None and hasattr(meta, "label_lower") and hasattr(value, "pk"):
        if value.pk is None:
            raise TypeError(f"cannot make a cache key from an unsaved {type(value).__name__}")
        return f"{meta.label_lower}:{encode(value.pk)}"
    raise TypeError(
        f"cannot make a cache key from a {type(value).__module__}.{type(value).__qualname__}; "
        "define __cache_key__() on it, or give the decorator key=callable returning str, "
        "int, tuples... for these arguments"
    )


def call_key(name: str, arguments: tuple[Any, ...]) -> str:
    """Return the key of a call to ``name`` with ``arguments``, each written by :func:`encode`."""
    text = f"{name}({','.join(encode(argument) for argument in arguments)})"
    if len(text) <= MAX_READABLE and _safe(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS]
    if len(name) > MAX_READABLE - _DIGEST_CHARS - 1 or not _safe(name):
        name = "call"
    return f"{name}#{digest}"


def _safe(text: str) -> bool:
    """Printable ASCII without space: what memcached (and Django's key checks) accept."""
    return all(33 <= ord(char) <= 126 for char in text)


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _sequence(values: Any, opening: str, closing: str) -> str:
    return opening + ",".join(encode(v) for v in values) + closing


def _tuple(value: tuple[Any, ...]) -> str:
    return _sequence(value, "(", ",)" if len(value) == 1 else ")")


def _dict(value: dict[Any, Any]) -> str:
    return "{" + ",".join(sorted(f"{encode(k)}:{encode(v)}" for k, v in value.items())) + "}"


def _set(value: set[Any] | frozenset[Any]) -> str:
    return "set(" + ",".join(sorted(encode(v) for v in value)) + ")"


# Order matters: bool and Enum before int (IntEnum, True are ints), datetime before date.
_WRITERS: tuple[tuple[type | tuple[type, ...], Callable[[Any], str]], ...] = (
    (type(None), lambda _: "None"),
    (bool, repr),
    (enum.Enum, lambda v: f"{_qualified(type(v))}.{v.name}"),
    (int, lambda v: str(int(v))),
    (float, lambda v: repr(float(v))),
    (str, lambda v: json.dumps(str(v))),
    (bytes, lambda v: f"b:{bytes(v).hex()}"),
    (decimal.Decimal, lambda v: f"Decimal({v})"),
    (_TEMPORAL, lambda v: f"{type(v).__name__}({v.isoformat()})"),
    (datetime.timedelta, lambda v: f"timedelta({v.days},{v.seconds},{v.microseconds})"),
    (uuid.UUID, lambda v: f"UUID({v})"),
    (tuple, _tuple),
    (list, lambda v: _sequence(v, "[", "]")),
    (dict, _dict),
    ((set, frozenset), _set),
    (type, lambda v: f"<{_qualified(v)}>"),
)
