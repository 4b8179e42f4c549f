"""The near cache's pure parts: its options, its table keys, and how a value is kept apart.

Read :mod:`django_mcpatterns.core.near` first.  Nothing here does I/O; the table
itself is ``_model_table.py``.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import fractions
import math
import pickle
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..exceptions import ConfigurationError
from ..keys import Key, Routed

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REFRESH_AHEAD",
    "ENTRY_OVERHEAD",
    "LARGE_VALUE",
    "NEAR_OPTIONS",
    "Copier",
    "Kept",
    "NearOptions",
    "NearStats",
    "keep",
    "near_key",
]

NEAR_OPTIONS: Final = ("max_age", "max_bytes", "prefixes", "refresh_ahead")
DEFAULT_MAX_AGE: Final = 0.1
DEFAULT_MAX_BYTES: Final = 32 * 2**20
DEFAULT_REFRESH_AHEAD: Final = 0.5
MIN_BYTES: Final = 64 * 1024
# What an entry costs besides its key and value: the entry object, its slots in
# the table's dict and order list, with their slack (measured: benchmarks/bench_near.py).
ENTRY_OVERHEAD: Final = 280
# From this size on (bytes kept) an entry past max_age is revalidated by its
# cas (meta protocol) rather than read again.
LARGE_VALUE: Final = 8 * 1024
# Containers up to this many members are copied member by member on each hit
# (a C-level copy); bigger ones, or nested ones, are kept pickled.
SHALLOW_LIMIT: Final = 256
_NESTING: Final = 4  # tuples of tuples of ... kept as they are, this deep


@dataclass(frozen=True)
class NearOptions:
    """``OPTIONS["near_cache"]``, validated.

    ``max_age``: the longest a value is served from this process's memory after
    the request that read it was sent; ``max_bytes``: the memory the values,
    their keys and entries may take; ``prefixes``: ``(prefix, max_age)`` pairs,
    only keys under one are kept, each for at most its own bound (None: every
    key, for ``max_age``); ``refresh_ahead``: the fraction of ``max_age`` after which an
    entry read again during its life is re-read by the next miss sent to its server,
    in that miss's request (None: never; not under ``prefixes``).
    """

    max_age: float = DEFAULT_MAX_AGE
    max_bytes: int = DEFAULT_MAX_BYTES
    prefixes: tuple[tuple[str, float], ...] | None = None
    refresh_ahead: float | None = DEFAULT_REFRESH_AHEAD

    def __post_init__(self) -> None:
        age = self.max_age
        if not _positive(age):
            raise _refused("max_age", f"must be a number of seconds > 0, not {age!r}")
        size = self.max_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < MIN_BYTES:
            raise _refused("max_bytes", f"must be an integer >= {MIN_BYTES}, not {size!r}")
        ahead = self.refresh_ahead
        if ahead is not None and (not _positive(ahead) or ahead >= 1):
            raise _refused(
                "refresh_ahead",
                f"must be a fraction of max_age, > 0 and < 1 (or None: off), not {ahead!r}",
            )

    @classmethod
    def from_option(cls, given: Any) -> NearOptions | None:
        """Parse ``OPTIONS["near_cache"]``: a mapping (``{}``: the defaults), or None (off)."""
        if given is None or given is False:
            return None
        if not isinstance(given, Mapping):
            raise ConfigurationError(
                "option 'near_cache' must be a mapping with "
                + ", ".join(repr(name) for name in NEAR_OPTIONS)
                + f" (or None), not {given!r}",
                option="near_cache",
            )
        unknown = sorted(set(given) - set(NEAR_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"unknown near_cache option {unknown[0]!r}; valid options: "
                + ", ".join(repr(name) for name in NEAR_OPTIONS),
                option="near_cache",
                choices=NEAR_OPTIONS,
            )
        max_age = given.get("max_age", DEFAULT_MAX_AGE)
        ahead = given.get("refresh_ahead", DEFAULT_REFRESH_AHEAD)
        ahead = None if ahead is False else ahead
        options = cls(max_age, given.get("max_bytes", DEFAULT_MAX_BYTES), None, ahead)
        prefixes = _prefixes(given.get("prefixes"), options.max_age)
        return cls(options.max_age, options.max_bytes, prefixes, ahead)


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _refused(name: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"near_cache option {name!r} {problem}", option="near_cache")


def _prefixes(given: Any, max_age: float) -> tuple[tuple[str, float], ...] | None:
    """``prefixes``: None, a list of prefixes, or ``{prefix: max_age}`` (at most ``max_age``)."""
    if given is None:
        return None
    if isinstance(given, str) or not isinstance(given, Mapping | list | tuple | set | frozenset):
        raise _refused(
            "prefixes", f"must be a list of key prefixes or {{prefix: max_age}}, not {given!r}"
        )
    pairs = given.items() if isinstance(given, Mapping) else ((p, max_age) for p in given)
    found = []
    for prefix, age in pairs:
        if not isinstance(prefix, str) or not prefix:
            raise _refused("prefixes", f"holds {prefix!r}: prefixes are non-empty strings")
        if not _positive(age) or age > max_age:
            raise _refused(
                "prefixes", f"gives {prefix!r} the bound {age!r}: a number > 0, <= max_age"
            )
        found.append((prefix, float(age)))
    # Longest first: a key under nested prefixes takes the most specific bound.
    return tuple(sorted(found, key=lambda pair: -len(pair[0])))


# -- counts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NearStats:
    """What a near cache did, since it was made (counts) and now (entries, bytes)."""

    hits: int
    misses: int
    round_trips_saved: int
    fills: int
    refused: int
    evictions: int
    invalidations: int
    revalidated: int
    refreshed: int
    entries: int
    bytes: int
    max_bytes: int
    max_age: float

    @property
    def hit_ratio(self) -> float | None:
        looked = self.hits + self.misses
        return self.hits / looked if looked else None

    def as_dict(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["hit_ratio"] = self.hit_ratio
        return found


# -- table keys --------------------------------------------------------------------------


def near_key(key: Key) -> str:
    """The table key of a store key: the text of the bytes memcached stores.

    ``"k"``, ``b"k"`` and a :class:`Routed` of ``b"k"`` are one item (the same
    bytes on the wire), so they are one entry: a write under one form drops a
    copy read under another.  Bytes that are not UTF-8 keep their identity
    (``surrogateescape``).  The hot path passes ``str`` keys as they are.
    """
    if type(key) is str:
        return key
    raw = key.key if type(key) is Routed else key
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "surrogateescape")
    if isinstance(key, str):
        return str.__str__(key)
    raise TypeError(f"memcached keys are str or bytes, not {type(key).__name__}")


# -- keeping a value apart from its callers ------------------------------------------------

Copier = Callable[[Any], Any]

_SCALARS: Final[frozenset[type]] = frozenset(
    {
        str,
        bytes,
        int,
        float,
        bool,
        complex,
        type(None),
        decimal.Decimal,
        fractions.Fraction,
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        datetime.timezone,
        uuid.UUID,
        range,
    }
)
_COPIES: Final[dict[type, Copier]] = {dict: dict.copy, list: list.copy, set: set.copy}


Kept = tuple[Any, Copier | None, int]
"""A value as the table keeps it: ``(stored, copy, size)``; a hit hands out
``copy(stored)`` (``stored`` itself when ``copy`` is None); ``size``: the bytes it
takes in this process (what ``max_bytes`` counts)."""


def keep(value: Any) -> Kept | None:
    """How to keep ``value`` so that no caller can change what the next one gets.

    Immutable values (str, bytes, numbers, dates, UUIDs, tuples and frozensets
    of them) are kept and handed out as they are: a hit costs no copy.  A
    dict, list or set of such values is copied on each hit (one C-level copy).
    Anything else is kept pickled and unpickled on each hit, a fresh object
    every time.  None: a value that cannot be kept apart (it does not pickle).
    """
    kind = type(value)
    if kind is str or kind is bytes:  # the common case, first
        return value, None, sys.getsizeof(value)
    size = _immutable_size(value, _NESTING)
    if size is not None:
        return value, None, size
    copier = _COPIES.get(kind)
    if copier is not None and len(value) <= SHALLOW_LIMIT:
        size = _shallow_size(value)
        if size is not None:
            return copier(value), copier, size
    try:
        pickled = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:  # any object may refuse to pickle, in any way
        return None
    return pickled, pickle.loads, sys.getsizeof(pickled)


def _immutable_size(value: Any, depth: int) -> int | None:
    """The size of ``value`` if nothing in it can change, else None."""
    kind = type(value)
    if kind in _SCALARS:
        return sys.getsizeof(value)
    if (kind is tuple or kind is frozenset) and depth > 0 and len(value) <= SHALLOW_LIMIT:
        total = sys.getsizeof(value)
        for member in value:
            size = _immutable_size(member, depth - 1)
            if size is None:
                return None
            total += size
        return total
    return None


def _shallow_size(value: Any) -> int | None:
    """The size of a dict, list or set whose members are immutable scalars, else None."""
    total = sys.getsizeof(value)
    members = value.items() if type(value) is dict else ((member, None) for member in value)
    scalars = _SCALARS
    for first, second in members:
        if type(first) not in scalars or type(second) not in scalars:
            return None
        total += sys.getsizeof(first) + (0 if second is None else sys.getsizeof(second))
    return total
