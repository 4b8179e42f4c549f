"""Namespaces' key derivation and tagged-value format: pure code both forms share.

The namespace algorithms (:mod:`django_mcpatterns.core.namespaces`) are written once in
``_async.py``; what needs no store lives here: how parts become
an id and keys, and the header a namespaced value carries (read
:mod:`django_mcpatterns.core.namespaces` for both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final
from urllib.parse import quote

from ..exceptions import EncodingError
from ..keys import Key, PlainKey
from ..values.envelope import Envelope

__all__ = [
    "FORMAT",
    "INVALIDATE_ATTEMPTS",
    "MAGIC",
    "MAX_DEPTH",
    "MAX_READABLE_ID",
    "MISSING",
    "REMEMBERED_PATHS",
    "KeyMaker",
    "Missing",
    "Part",
    "Path",
    "layout_of",
    "namespace_id",
    "part_text",
    "path_segment",
    "plain_key",
    "stale_of",
    "unpack",
    "version_of",
]

Part = str | int
Path = tuple[tuple[str, ...], ...]
KeyMaker = Callable[[str, Any], PlainKey]
"""``(local key, version) -> final key``: the host's key rules (prefix, version)."""

MAX_READABLE_ID: Final = 64
MAX_DEPTH: Final = 255  # the depth is one byte of the value header
REMEMBERED_PATHS: Final = 1024
MAGIC: Final = b"ns"
FORMAT: Final = 1
INVALIDATE_ATTEMPTS = 5


class Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing()


# -- key derivation ------------------------------------------------------------------


def part_text(part: Part) -> str:
    """The text of one namespace part: a ``str`` as is, an ``int`` in decimal."""
    if isinstance(part, str):
        return part
    if isinstance(part, int) and not isinstance(part, bool):
        return int.__repr__(part)  # decimal, also for IntEnum members
    raise TypeError(f"namespace parts are str or int, not {type(part).__name__}: {part!r}")


def path_segment(parts: tuple[Part, ...]) -> tuple[str, ...]:
    if not parts:
        raise ValueError("a namespace needs at least one part")
    return tuple(part_text(part) for part in parts)


def namespace_id(path: Path) -> str:
    """The ``<id>`` of a namespace's keys: readable, or ``#`` and a digest when long.

    Percent-encoding leaves only ``A-Z a-z 0-9 _ . - ~`` and ``%XX``; ``:``
    separates parts and ``/`` levels, so the text is injective, and it never
    holds ``|`` (which ends the id in value keys) or ``#`` (which starts a
    digest).
    """
    readable = "/".join(
        ":".join(quote(part, safe="", errors="surrogatepass") for part in segment)
        for segment in path
    )
    if len(readable) <= MAX_READABLE_ID:
        return readable
    return "#" + hashlib.blake2b(readable.encode(), digest_size=20).hexdigest()


def plain_key(key: str, version: Any) -> str:
    """The core's key rule: the local key, after ``<version>:`` when one is given."""
    return key if version is None else f"{version}:{key}"


# -- the value header ----------------------------------------------------------------


@lru_cache(maxsize=MAX_DEPTH + 1)
def layout_of(depth: int) -> struct.Struct:
    """The header and versions of a value written at ``depth``, unpacked in one call."""
    return struct.Struct(f">2sBBdI{depth}Q")


def unpack(key: Key, raw: Any, depth: int, layout: struct.Struct) -> tuple[Any, ...]:
    """``(magic, format, depth, written_at, flags, *versions)`` of a tagged value, or raise."""
    if type(raw) is not bytes or raw[:2] != MAGIC:
        found = f"{len(raw)} bytes" if isinstance(raw, bytes) else type(raw).__name__
        raise EncodingError(
            f"cache key {key!r} is a namespaced key but holds something else ({found}); "
            "only the namespace API writes namespaced keys"
        )
    if len(raw) < layout.size or raw[2] != FORMAT or raw[3] != depth:
        fmt, found_depth = (raw[2], raw[3]) if len(raw) >= 4 else ("?", "?")
        raise EncodingError(
            f"cache key {key!r} holds a namespaced value of format {fmt} and depth "
            f"{found_depth} ({len(raw)} bytes); this release reads format {FORMAT} "
            f"and the namespace is {depth} deep"
        )
    return layout.unpack_from(raw)


def version_of(raw: Any, key: Key) -> int | None:
    """A version key's value as a number (None: missing)."""
    if raw is None:
        return None
    if type(raw) is bytes:
        try:
            return int(raw)  # memcached's incr may leave trailing spaces; int() skips them
        except ValueError:
            pass
    elif type(raw) is int:
        return raw
    raise EncodingError(f"namespace version key {key!r} holds {raw!r}, not a decimal counter")


def stale_of(value: Any, written_at: float) -> Envelope:
    """An invalidated value as stampede sees it in a soft namespace: stale since written.

    Deterministic for the stored item, so a re-read after winning the recompute
    lock tells "still the invalidated value" from "refreshed meanwhile".
    """
    if type(value) is Envelope:
        return dataclasses.replace(value, soft_expiry=min(value.soft_expiry, written_at))
    return Envelope(value, soft_expiry=written_at)
