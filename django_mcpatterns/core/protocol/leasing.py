"""Reads that take memcached's own leases (``mg <key> ... N<ttl>``), sans-IO.

A miss read with ``N<ttl>`` is *vivified*: the server stores an empty item for
``ttl`` seconds and answers this reader with the win token ``W`` and the new
item's cas; every later reader gets that item with ``Z`` until the winner
stores over it by cas (``ms <key> C<cas>``), gives it back (``md <key> C<cas>``)
or it expires.  So the lease rides on the read: a cold miss costs the read and
the fill, and the others wait for the fill instead of computing it again.

:class:`LeasedFetch` is the exchange of ``gets_leased``: on the leased key's
server ``mg <key> v c f N<ttl>`` and a ``gets`` of that server's other keys,
written at once; elsewhere the plain ``gets``.  :func:`lease_requests` is
``lease``'s one write: delete the version found useless, then vivify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..keys import Key
from ..store import Leased
from ..values.envelope import STALE
from ..values.refusals import is_refused
from .compiled import maker
from .decoding import Fetch, hits
from .meta import MetaDelete, MetaGet
from .replies import reply_error
from .wire import ErrorReply, MetaReply, Request

__all__ = [
    "NOT_LEASING",
    "LeasedFetch",
    "lease_answer",
    "lease_requests",
    "leased",
    "leased_reply",
]

Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)
Part = tuple[dict[bytes, Any], MetaReply | None]

NOT_LEASING = Leased({}, leasing=False)
new_leased = maker(Leased)  # Leased from its four fields (in C where compiled)
"""``lease``'s answer where no lease can be taken (text mode, a replicated key)."""


class _LeasingGet(MetaGet):
    """``mg <key> v c f N<ttl>``, the leasing read's request, encoded in one step (it is
    on every leased read's path; :meth:`MetaGet.encode` joins a dozen optional flags)."""

    __slots__ = ()

    def encode(self) -> bytes:
        return b"mg %b v c f N%d\r\n" % (self.key, self.vivify or 0)  # always given


_READS_KEPT = 4096
_reads: dict[tuple[bytes, int], _LeasingGet] = {}
"""Leasing reads by key and TTL: a frozen request is made field by field (some 15k
instructions), and a process reads the same few results over and over."""


def _leasing_get(kb: bytes, ttl: int) -> _LeasingGet:
    read = _reads.get((kb, ttl))
    if read is None:
        if len(_reads) >= _READS_KEPT:
            _reads.clear()
        read = _reads[kb, ttl] = _LeasingGet(
            kb, value=True, cas=True, client_flags=True, vivify=ttl
        )
    return read


class LeasedFetch:
    """``gets`` of one server's keys; on the leased key's server its ``mg ... N<ttl>`` first."""

    __slots__ = ("fetch", "kb", "ttl")

    def __init__(self, fetch: Fetch, kb: bytes, ttl: int) -> None:
        self.fetch = fetch  # a cas-returning Fetch (Decoders.fetch_cas)
        self.kb = kb
        self.ttl = ttl  # memcached's exptime (commands.expire_time)

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        kb = self.kb
        if kb not in kbs:
            return self.fetch.requests(kbs)
        read = _leasing_get(kb, self.ttl)
        others = [other for other in kbs if other != kb]
        return (read, *self.fetch.requests(others)) if others else (read,)

    def result(self, replies: list[Any], kbs: list[bytes]) -> Part:
        kb = self.kb
        if kb not in kbs:
            return self.fetch.result(replies, kbs), None
        read, *rest = replies
        if isinstance(read, ErrorReply):
            raise reply_error(read)
        others = [other for other in kbs if other != kb]
        return (self.fetch.result(rest, others) if others else {}), read

    def failed(self, kbs: list[bytes]) -> Part:
        return {}, None


def leased(
    serde: Serde, kb: bytes, key: Key, given: Mapping[bytes, Key], parts: list[Part]
) -> Leased:
    """``gets_leased``'s answer from its servers' parts: the hits, and the lease's verdict."""
    found = hits([part[0] for part in parts], given, cas=True)
    for part in parts:
        if part[1] is not None:
            return leased_reply(serde, kb, key, part[1], found)
    return Leased(found, leasing=False)  # the key's server could not be used: no lease


def leased_reply(
    serde: Serde, kb: bytes, key: Key, reply: MetaReply, found: dict[Any, Any]
) -> Leased:
    """Judge the reply to ``mg <key> [v] c f N<ttl>`` (adding its value to ``found``)."""
    flags = reply.flags  # read as MetaReply's properties do, once each
    cas = flags.get("c")
    if reply.status not in (b"VA", b"HD") or cas is None:
        raise reply_error(reply)
    token = b"%d" % int(cas)
    won, lost = "W" in flags, "Z" in flags
    data = reply.data
    raw_flags = flags.get("f")
    client_flags = 0 if raw_flags is None else int(raw_flags)
    if data is not None and not ((won or lost) and not data and not client_flags):  # vivified
        value = serde.deserialize(kb, data, client_flags)
        if value is not STALE and not is_refused(value):  # past its soft expiry, or refused
            found[key] = (value, token)
    return new_leased(found, token if won else None, lost, True)


def lease_requests(kb: bytes, ttl: int, replacing: bytes | None) -> tuple[Request[Any], ...]:
    """``lease``'s one write: ``md <key> C<cas>`` of the version found useless, then vivify.

    ``ttl`` and ``replacing`` are memcached's forms (commands.expire_time, cas_token).
    """
    read = MetaGet(kb, cas=True, vivify=ttl)
    if replacing is None:
        return (read,)
    return (MetaDelete(kb, cas=int(replacing)), read)


def lease_answer(serde: Serde, kb: bytes, key: Key, replies: list[Any] | None) -> Leased:
    """``lease``'s answer: its verdict (``NOT_LEASING``: the server could not be used)."""
    if replies is None:
        return NOT_LEASING
    read = replies[-1]
    if isinstance(read, ErrorReply):
        raise reply_error(read)
    if len(replies) > 1 and isinstance(replies[0], ErrorReply):
        raise reply_error(replies[0])
    return leased_reply(serde, kb, key, read, {})
