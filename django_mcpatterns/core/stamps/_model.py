"""The pure parts of stamps: keys, the scheme registry's encoding, judging a cached read.

A *stamp* is a memcached item holding a random token.  A cached result carries
the tokens of every stamp it was computed under; it is valid only while each of
those stamps still holds that very token.  Writers invalidate by deleting
stamps, so a stamp that is missing (deleted, evicted, expired, lost in a
restart) invalidates every result built on it: eviction can cost a miss, never
a stale read.  Tokens are random, never counters, so a stamp recreated after an
eviction cannot repeat an old value (no ABA), and no clock is compared.

A *registry* lists the dependency schemes of one table (tuples of column
names whose equality values a cached query pins, as in cacheops' conjunctions)
so that every process's writers know which conjunction stamps a row's values
match.  It is one append-only item: a first line with its generation token,
then one line per scheme.  Results built on a scheme carry the registry's
generation: a registry lost and recreated voids them, because writers that
found it missing could not have bumped their conjunctions.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.protocol.compiled import maker
from django_mcpatterns.core.store import Leased

__all__ = [
    "MAX_SCHEMES",
    "Cached",
    "Plan",
    "Read",
    "Registry",
    "Scheme",
    "backoff",
    "conjunction_key",
    "conjunctions",
    "judge",
    "new_token",
    "registry_key",
    "registry_line",
    "registry_start",
    "table_key",
    "tokens_for",
]

Scheme = tuple[str, ...]
"""Sorted column names whose values a query pins (a cacheops "scheme")."""

MAX_SCHEMES: Final = 64
"""A registry with this many schemes takes no more: queries of other shapes use the table."""

_GEN: Final = b"g:"
_PARSED_KEPT: Final = 1024
_parsed: dict[bytes, Registry] = {}
"""Registries by their bytes: every read of a pinned query parses its table's, which
changes only when a scheme is added or the registry is made again."""


def new_token() -> bytes:
    """A fresh stamp value: 64 random bits, never reused, comparable across processes."""
    return os.urandom(8).hex().encode()


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()


def table_key(prefix: str, db: str, table: str) -> str:
    """The stamp every query on ``table`` that pins nothing depends on."""
    return f"{prefix}t:{_digest(db, table)}"


def registry_key(prefix: str, db: str, table: str) -> str:
    """The item listing ``table``'s schemes (:class:`Registry`)."""
    return f"{prefix}r:{_digest(db, table)}"


def conjunction_key(prefix: str, db: str, table: str, scheme: Scheme, values: Sequence[str]) -> str:
    """The stamp of the rows of ``table`` whose ``scheme`` columns equal ``values``.

    ``values`` are canonical text (the caller's encoding, the same for readers
    and writers), in the order of ``scheme``.
    """
    pairs = "\0".join(f"{c}\1{v}" for c, v in zip(scheme, values, strict=True))
    return f"{prefix}c:{_digest(db, table, pairs)}"


def registry_start(token: bytes, scheme: Scheme | None = None) -> bytes:
    """A new registry's bytes: its generation, and a first scheme."""
    head = _GEN + token + b"\n"
    return head + registry_line(scheme) if scheme is not None else head


def registry_line(scheme: Scheme) -> bytes:
    """The line that adds ``scheme`` to a registry (appended)."""
    return ",".join(scheme).encode() + b"\n"


@dataclass(frozen=True, slots=True)
class Registry:
    """A table's registry as read: its generation and its schemes."""

    generation: bytes
    schemes: frozenset[Scheme]

    @classmethod
    def parse(cls, raw: Any) -> Registry | None:
        """The registry ``raw`` holds; None for anything else (a miss, garbage)."""
        if not isinstance(raw, bytes) or not raw.startswith(_GEN):
            return None
        found = _parsed.get(raw)
        if found is None or type(found) is not cls:
            lines = raw.split(b"\n")
            schemes = frozenset(tuple(line.decode().split(",")) for line in lines[1:] if line)
            found = cls(lines[0][len(_GEN) :], schemes)
            if len(_parsed) >= _PARSED_KEPT:
                _parsed.clear()
            _parsed[raw] = found
        return found


@dataclass(frozen=True, slots=True)
class Plan:
    """What one cached read depends on, known before any I/O.

    ``stamps``: stamp keys whose tokens must be unchanged.  ``schemes``: for each
    registry key, the scheme the read's conjunction stamps follow (it must be
    registered, and the registry's generation unchanged).
    """

    key: str
    stamps: tuple[str, ...]
    schemes: tuple[tuple[str, Scheme], ...] = ()

    def keys(self) -> list[str]:
        """Every key of the read's one multi-get: the result, its stamps, its registries."""
        return [self.key, *self.dependencies()]

    def dependencies(self) -> list[str]:
        """The keys read with the result: its stamps and registries."""
        if not self.schemes:
            return list(self.stamps)
        return [*self.stamps, *[registry for registry, _ in self.schemes]]


@dataclass(frozen=True, slots=True)
class Cached:
    """What a result key holds: the tokens the value was computed under, and the value."""

    tokens: tuple[bytes, ...]
    value: Any

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as a call of the class: a slots dataclass's own pickling loops over its
        fields in Python both ways (25k and 23k instructions against 9k)."""
        return (Cached, (self.tokens, self.value))


@dataclass(frozen=True, slots=True)
class Read:
    """The judgment of one multi-get.

    ``hit``: the value is valid.  Otherwise what a fill needs: the result item's
    cas (to lease it), the tokens of the stamps that are there, the stamps that
    are missing, and the registries that lack the read's scheme.  A leasing read
    (memcached's own leases) adds ``lease``: the cas of the lease this read took
    on a missing result (fill by it, or give it back); ``pending``: another
    filler holds the lease; ``leasing``: the store took leases at all.
    """

    hit: bool
    value: Any = None
    cas: Any = None
    tokens: Mapping[str, bytes] | None = None
    missing: tuple[str, ...] = ()
    unregistered: tuple[tuple[str, Scheme, Registry | None], ...] = ()
    full: bool = False
    lease: Any = None
    pending: bool = False
    leasing: bool = False

    @property
    def present(self) -> bool:
        """The result key holds an item (an invalid result): a fill swaps it by cas."""
        return self.cas is not None


new_cached = maker(Cached)
"""Cached from its two fields, in C where compiled (a fill makes one)."""
_new_read = maker(Read)
"""Read from all its fields, positionally: a frozen dataclass's own ``__init__`` sets each
through ``object.__setattr__`` (15k instructions for a hit's Read, against 1k)."""


def _expected(plan: Plan, found: Mapping[Key, Any]) -> tuple[bytes | None, ...]:
    tokens: list[bytes | None] = []
    for key in plan.stamps:
        pair = found.get(key)
        tokens.append(pair[0] if pair is not None and isinstance(pair[0], bytes) else None)
    for registry, scheme in plan.schemes:
        pair = found.get(registry)
        parsed = Registry.parse(pair[0]) if pair is not None else None
        ok = parsed is not None and scheme in parsed.schemes
        tokens.append(parsed.generation if ok and parsed is not None else None)
    return tuple(tokens)


def judge(plan: Plan, found: Mapping[Key, tuple[Any, Any]], leased: Leased | None = None) -> Read:
    """Judge a ``gets_many`` of ``plan.keys()``: a valid hit, or what a fill must repair.

    ``leased``: the read was a leasing read (``gets_leased``), which found that.
    """
    result = found.get(plan.key)
    expected = _expected(plan, found)
    if (
        result is not None
        and type(result[0]) is Cached
        and None not in expected
        and result[0].tokens == expected
    ):
        return _new_read(True, result[0].value, None, None, (), (), False, None, False, False)
    tokens: dict[str, bytes] = {}
    missing: list[str] = []
    for key in plan.stamps:
        pair = found.get(key)
        if pair is not None and isinstance(pair[0], bytes):
            tokens[key] = pair[0]
        else:
            missing.append(key)
    unregistered: list[tuple[str, Scheme, Registry | None]] = []
    full = False
    for registry, scheme in plan.schemes:
        pair = found.get(registry)
        parsed = Registry.parse(pair[0]) if pair is not None else None
        if parsed is not None and scheme in parsed.schemes:
            tokens[registry] = parsed.generation
            continue
        full = full or (parsed is not None and len(parsed.schemes) >= MAX_SCHEMES)
        unregistered.append((registry, scheme, parsed))
    cas = result[1] if result is not None else None
    if leased is None:
        return _new_read(
            False, None, cas, tokens, tuple(missing), tuple(unregistered), full, None, False, False
        )
    return _new_read(
        False,
        None,
        cas,
        tokens,
        tuple(missing),
        tuple(unregistered),
        full,
        leased.lease,
        leased.pending,
        leased.leasing,
    )


def backoff(budget: float, first: float = 0.005) -> list[float]:
    """Pauses between reads while another process fills: doubling, adding up to ``budget``."""
    pauses: list[float] = []
    pause, total = first, 0.0
    while total + pause <= budget:
        pauses.append(pause)
        total += pause
        pause *= 2
    return pauses


def tokens_for(plan: Plan, tokens: Mapping[str, bytes]) -> tuple[bytes, ...] | None:
    """The tokens a fill records, in the plan's order; None when one is unknown."""
    try:  # a list made, not generators resumed per key: this runs on every fill
        return tuple([tokens[key] for key in plan.dependencies()])
    except KeyError:
        return None


def conjunctions(
    prefix: str,
    db: str,
    table: str,
    schemes: frozenset[Scheme],
    rows: Sequence[Mapping[str, str]],
) -> tuple[set[str], bool]:
    """The conjunction stamps that ``rows`` (canonical column values) match under ``schemes``.

    Also whether every scheme could be followed: a row that lacks a column of
    some scheme (its value is unknown to the writer) makes the answer False,
    and the caller invalidates the whole table instead.
    """
    keys: set[str] = set()
    for scheme in schemes:
        for row in rows:
            try:
                values = [row[column] for column in scheme]
            except KeyError:
                return keys, False
            keys.add(conjunction_key(prefix, db, table, scheme, values))
    return keys, True
