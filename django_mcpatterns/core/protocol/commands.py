"""Every Store command, written once: its request(s), reply decoding, outcome and text/meta choice.

:class:`StoreCommands` holds each command of the Store protocol (:mod:`..store`,
:mod:`..tokens`) as a plan (:mod:`.plans`); the sync
:class:`~..client.cluster.Cluster` and the asyncio
:class:`~..client.aio.AsyncCluster` subclass it and run the plans, each with
its own round-trip primitive.  Adding a command means a method here, the
embedded store's (:mod:`..memory`) and tests; nothing in the drivers.

Arguments are checked and values encoded before anything is sent: a bad key,
expire or delta, or a value the serde cannot encode, raises before any I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Literal, TypeVar

from ..exceptions import NeedsMetaProtocolError
from ..keys import Key, KeyT
from ..store import CasToken, Claimed, Leased
from . import steps
from .compiled import keyed, maker, new_call, new_get, new_store, placed
from .decoding import (
    NO_CAS,
    Decoders,
    DeleteMany,
    StoreMany,
    claimed,
    hits,
)
from .leasing import NOT_LEASING, LeasedFetch, lease_answer, lease_requests, leased
from .meta import MetaDelete, MetaGet, MetaSet
from .plans import Call, Each, FanOut, Forget, Plan, command, immediately, then
from .replies import (
    bumped_meta,
    bumped_text,
    cas_stored,
    count,
    deleted,
    meta_cas,
    meta_deleted,
    no_meta,
    ok,
    stats,
    stored,
    touched,
    ttl_left,
    written,
)
from .steps import EXPIRED
from .wire import Delete, FlushAll, Incr, Request, Stats, Store, StoreCommand, Touch

__all__ = ["StoreCommands", "cas_token", "encoded", "expire_time"]

MAX_DELTA = 2**64  # incr/decr deltas are unsigned 64-bit (protocol.txt)

Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)
Steps = Generator[Any, Any, Any]  # a plan of several steps (see plans.py)
R = TypeVar("R")


class StoreCommands:
    """The Store commands, once; a driver subclass provides ``run`` and what plans read.

    ``serde`` encodes values and ``decoders`` decode replies; ``text`` is
    ``OPTIONS["protocol"] == "text"`` (no meta command is sent);
    :meth:`copies` says on how many servers a key is kept (replication).
    """

    serde: Serde
    decoders: Decoders
    text: bool

    def copies(self, kb: bytes, ring: bytes) -> int:
        raise NotImplementedError

    def replicated_keys(self, given: Mapping[bytes, Key]) -> dict[bytes, bytes]:
        """The keys of ``given`` kept on several servers, each with the bytes placing them."""
        raise NotImplementedError

    # -- reads --

    @command
    def get(self, key: Key, default: Any = None) -> Plan[Any]:
        kb, ring = placed(key)
        return new_call(ring, new_get((kb,), False), self.decoders.value, default, True)  # spread

    @command
    def gets(self, key: Key) -> Plan[tuple[Any, CasToken | None]]:
        kb, ring = placed(key)
        return new_call(ring, new_get((kb,), True), self.decoders.value_cas, NO_CAS, True)  # spread

    @command
    def gets_envelope(self, key: Key) -> Plan[tuple[Any, CasToken | None]]:
        """``gets`` returning a soft-expiry envelope as an ``Envelope`` (see Store)."""
        kb, ring = placed(key)
        return new_call(
            ring, new_get((kb,), True), self.decoders.envelope_cas, NO_CAS, True
        )  # spread

    @command
    def get_many(self, keys: Iterable[Key]) -> Plan[dict[Key, Any]]:
        """Return the hits only, keyed by the keys as given."""
        given = keyed(keys)
        fanned = FanOut(self.decoders.fetch, given, spread=True)
        return then(fanned, lambda parts: hits(parts, given, cas=False))

    @command
    def gets_many(self, keys: Iterable[Key]) -> Plan[dict[Key, tuple[Any, CasToken]]]:
        given = keyed(keys)
        fanned = FanOut(self.decoders.fetch_cas, given)
        return then(fanned, lambda parts: hits(parts, given, cas=True))

    @command
    def get_many_envelopes(self, keys: Iterable[Key]) -> Plan[dict[Key, Any]]:
        given = keyed(keys)
        fanned = FanOut(self.decoders.fetch_envelopes, given, spread=True)
        return then(fanned, lambda parts: hits(parts, given, cas=False))

    @command
    def ttl(self, key: Key) -> Plan[int | None]:
        """Return the seconds the item has left (-1: never expires), None when it is missing.

        Meta protocol only (``mg <key> t``): in text mode (twemproxy, mcrouter)
        raise :class:`NeedsMetaProtocolError` before any I/O; rewriters then
        keep the expiry their items record (:mod:`..append`).
        """
        kb, ring = placed(key)
        if self.text:
            raise NeedsMetaProtocolError(
                "ttl needs memcached's meta protocol (mg <key> t), and "
                "OPTIONS['protocol'] is 'text'",
                option="protocol",
            )
        return Call(ring, MetaGet(kb, ttl=True), ttl_left, None)

    @command
    def cas_of(self, key: Key) -> Plan[CasToken | None]:
        """The item's cas token without its value (``mg <key> c``); None when it is missing.

        What revalidates a value held near (:mod:`..near`): one round trip, no
        value sent.  Meta protocol only: in text mode raise
        :class:`NeedsMetaProtocolError` before any I/O.  Read from the key's home
        server (never a replica, whose cas is its own counter's).
        """
        kb, ring = placed(key)
        if self.text:
            raise NeedsMetaProtocolError(
                "cas_of needs memcached's meta protocol (mg <key> c), and "
                "OPTIONS['protocol'] is 'text'",
                option="protocol",
            )
        return Call(ring, MetaGet(kb, cas=True), meta_cas, None)

    @command
    def bump(self, key: Key) -> Plan[bool]:
        """Refresh the item's place in the LRU without reading it or changing its TTL.

        Return whether it was there.  Meta: ``mg <key>`` with no flags ("HD" or
        "EN", no value sent back).  Text: memcached's "touching keys with add"
        trick: an ``add`` that finds the item moves it to the head of the LRU
        and answers NOT_STORED; on a miss it stores an item already expired
        (exptime in 1970), so nothing appears.
        """
        kb, ring = placed(key)
        if self.text:
            return Call(ring, Store("add", kb, b"", 0, EXPIRED), bumped_text, False)
        return Call(ring, MetaGet(kb), bumped_meta, False)

    # -- writes --

    @command
    def set(self, key: Key, value: Any, expire: int = 0) -> Plan[bool]:
        return self._store("set", key, value, expire)

    @command
    def add(self, key: Key, value: Any, expire: int = 0) -> Plan[bool]:
        return self._store("add", key, value, expire)

    @command
    def append(self, key: Key, value: bytes) -> Plan[bool]:
        return _concatenate("append", key, value)

    @command
    def prepend(self, key: Key, value: bytes) -> Plan[bool]:
        return _concatenate("prepend", key, value)

    def _store(self, verb: StoreCommand, key: Key, value: Any, expire: int) -> Call[bool]:
        kb, ring = placed(key)
        data, flags = self.decoders.encoded(kb, value)
        request = new_store(verb, kb, data, flags, expire_time(expire), None)
        return new_call(ring, request, written, False, False)

    @command
    def cas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> Plan[bool | None]:
        kb, ring = placed(key)
        data, flags = self.decoders.encoded(kb, value)
        exptime = expire_time(expire)

        def swap(token: CasToken) -> Call[bool | None]:  # made field by field (makers)
            request = new_store("cas", kb, data, flags, exptime, cas_token(token))
            return new_call(ring, request, cas_stored, False, False)

        return steps.on_home(kb, cas, swap, False)

    @command
    def incr(self, key: Key, delta: int = 1) -> Plan[int | None]:
        kb, ring = placed(key)
        return Call(ring, Incr(kb, _delta(delta)), count, None)

    @command
    def decr(self, key: Key, delta: int = 1) -> Plan[int | None]:
        kb, ring = placed(key)
        return Call(ring, Incr(kb, _delta(delta), decr=True), count, None)

    @command
    def delete(self, key: Key) -> Plan[bool]:
        kb, ring = placed(key)
        return Call(ring, Delete(kb), deleted, False)

    @command
    def forget(self, key: Key, marker: bytes | None = None, expire: int = 0) -> Plan[bool]:
        """Delete ``key`` now, or, when its server cannot be used, before it serves again.

        The repair of a write that could not reach its server (docs/failures.md):
        the server's journal holds it, and the server runs it before this process
        sends it anything else.  ``marker``: store these raw bytes (flags 0,
        ``expire``) instead of deleting, for an item that must read as
        incomplete (a set or list that lost writes).  Return True when it was
        done now, False when it was journaled; never raises for the server.
        """
        kb, ring = placed(key)
        if marker is None:
            request: Request[Any] = Delete(kb)
        else:  # raw bytes, as sets and lists store theirs
            data, flags = encoded(self.serde, kb, bytes(marker))
            request = Store("set", kb, data, flags, expire_time(expire))
        return then(Forget(ring, kb, request), bool)

    @command
    def touch(self, key: Key, expire: int = 0) -> Plan[bool]:
        kb, ring = placed(key)
        return Call(ring, Touch(kb, expire_time(expire)), touched, False)

    @command
    def set_many(self, values: Mapping[KeyT, Any], expire: int = 0) -> Plan[list[KeyT]]:
        """Store every value; return the keys that were *not* stored.

        A key fails alone: a value over the item size limit, or a server that
        cannot be used, fails only its own keys.
        """
        if isinstance(expire, bool) or not isinstance(expire, int):
            raise ValueError(f"expire must be an integer, not {expire!r}")
        given = keyed(values)
        # Every value is encoded before anything is sent: one that cannot be raises alone.
        encode = self.decoders.encoded
        values_of = {kb: encode(kb, values[key]) for kb, key in given.items()}
        store_many = StoreMany(values_of, expire_time(expire))
        replicated = self.replicated_keys(given)
        if any(kb != ring for kb, ring in replicated.items()):
            return steps.set_many(store_many, given, replicated)
        fanned = FanOut(store_many, given, write=True)  # replicated keys: on every replica
        return then(fanned, lambda parts: steps.not_stored(parts, given))

    @command
    def delete_many(self, keys: Iterable[Key]) -> Plan[None]:
        given = keyed(keys)
        return then(FanOut(DeleteMany(), given, write=True), _nothing)

    # -- owner primitives: one meta command, or text commands in one write (store.py) --

    @command
    def exchange(self, key: Key, requests: Sequence[Request[Any]]) -> Plan[list[Any] | None]:
        """Send wire requests (:mod:`.wire`) to ``key``'s server in one write; return the replies.

        Routing, failover and outcomes are those of every command: None when
        the server cannot be used and the view degrades (the strict view
        raises :class:`NodeUnavailableError`, or :class:`OutcomeUnknownError`
        once the requests may have left).  Error replies are returned as
        :class:`~.wire.ErrorReply`, for the caller to judge; a command the
        server does not know raises :class:`CommandNotSupportedError`.
        """
        _, ring = placed(key)
        batch = tuple(requests)
        if self.text:
            no_meta(batch)
        return Call(ring, batch, None, None)

    @command
    def gets_ttl(self, key: Key) -> Plan[tuple[Any, CasToken | None, int | None]]:
        """Return ``(value, cas_token, ttl)``; over text the TTL is not read (None)."""
        if self.text:
            return then(StoreCommands.gets.plan(self, key), lambda found: (*found, None))
        kb, ring = placed(key)
        request = MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True)
        decode = partial(self.decoders.value_cas_ttl, kb)
        return Call(ring, request, decode, (None, None, None))

    @command
    def add_cas(self, key: Key, value: Any, expire: int = 0) -> Plan[CasToken | None]:
        """``add``, returning the new item's cas token (None: not stored)."""
        kb, ring = placed(key)
        data, flags = self.decoders.encoded(kb, value)
        if self.text:
            return steps.text_cas(ring, Store("add", kb, data, flags, expire_time(expire)))
        request = MetaSet(
            kb, data=data, mode="E", ttl=expire_time(expire), client_flags=flags, return_cas=True
        )
        return Call(ring, request, meta_cas, None)

    @command
    def recas(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> Plan[CasToken | None]:
        """``cas``, returning the new item's cas token (None: not stored)."""
        kb, ring = placed(key)
        data, flags = self.decoders.encoded(kb, value)
        text = self.text

        def swap(token: CasToken) -> Plan[CasToken | None]:
            checked = cas_token(token)
            if text:
                return steps.text_cas(
                    ring, Store("cas", kb, data, flags, expire_time(expire), checked)
                )
            return Call(ring, _meta_swap(kb, data, flags, checked, expire), meta_cas, None)

        return steps.on_home(kb, cas, swap, None)

    @command
    def delete_cas(self, key: Key, cas: CasToken) -> Plan[bool]:
        """Delete the item only while its cas token is ``cas``."""
        kb, ring = placed(key)
        text = self.text

        def delete(token: CasToken) -> Plan[bool]:
            checked = cas_token(token)
            if text:
                return steps.expire_version(kb, ring, checked)
            return Call(ring, MetaDelete(kb, cas=int(checked)), meta_deleted, False)

        return steps.on_home(kb, cas, delete, False)

    # -- server-side stampede tokens (tokens.TokenStore; meta mode only) --

    @command
    def claim(
        self, key: Key, recache: int | None, placeholder: Any = None, placeholder_ttl: int = 0
    ) -> Plan[Claimed | None]:
        """``mg v c f t R<recache>`` and, given a placeholder, its add: one write (tokens.py).

        None (the lock-based path decides) in text mode and for a replicated
        key: its tokens would be one replica's, and its reads are spread.
        """
        kb, ring = placed(key)
        if self.text or self.copies(kb, ring) > 1:
            return immediately(None)
        batch = _claim_requests(self.serde, kb, recache, placeholder, placeholder_ttl)
        call = Call(ring, batch, None, None)
        serde = self.serde
        # None: unreachable (degrading view): the lock-based path decides.
        return then(call, lambda replies: None if replies is None else claimed(serde, kb, replies))

    @command
    def cas_stale(self, key: Key, value: Any, cas: CasToken, expire: int = 0) -> Plan[bool | None]:
        """``cas``; in meta mode then ``md <key> I`` of that very version, so one reader gets ``W``.

        The invalidation names the cas the swap handed back: sent blindly after
        a swap that failed, it would mark whatever the key holds by then (a
        filler's placeholder, voiding its lease and wedging the key).
        """
        if self.text:
            return StoreCommands.cas.plan(self, key, value, cas, expire)
        kb, ring = placed(key)
        data, flags = self.decoders.encoded(kb, value)

        def swap_and_mark(token: CasToken) -> Plan[bool | None]:
            swap = _meta_swap(kb, data, flags, cas_token(token), expire)
            return steps.swap_and_mark(kb, ring, swap)

        return steps.on_home(kb, cas, swap_and_mark, False)

    # -- leasing reads (store.LeaseStore; memcached's vivify-on-miss, leasing.py) --

    @command
    def gets_leased(self, key: Key, others: Iterable[Key], ttl: int) -> Plan[Leased]:
        """``gets_many`` of ``key`` and ``others``, one round trip per server; a missing
        ``key`` is leased for ``ttl`` seconds by ``mg <key> v c f N<ttl>`` in that trip.

        No lease (``leasing`` False) in text mode or for a replicated key.
        """
        kb, ring = placed(key)
        given: dict[bytes, Key] = keyed(others)
        given[kb] = key
        if self.text or self.copies(kb, ring) > 1:
            plain = FanOut(self.decoders.fetch_cas, given)
            return then(plain, lambda parts: Leased(hits(parts, given, cas=True), leasing=False))
        fanned = FanOut(LeasedFetch(self.decoders.fetch_cas, kb, expire_time(ttl)), given)
        return then(fanned, partial(leased, self.serde, kb, key, given))

    @command
    def lease(self, key: Key, ttl: int, replacing: CasToken | None = None) -> Plan[Leased]:
        """Lease ``key`` for ``ttl`` seconds: ``md <key> C<replacing>`` (the version found
        useless), then ``mg <key> c N<ttl>``, in one write.  ``found`` is empty."""
        kb, ring = placed(key)
        if self.text or self.copies(kb, ring) > 1:
            return immediately(NOT_LEASING)
        token = None if replacing is None else cas_token(replacing)
        call = Call(ring, lease_requests(kb, expire_time(ttl), token), None, None)
        return then(call, partial(lease_answer, self.serde, kb, key))

    # -- whole-cluster commands --

    @command
    def flush_all(self) -> Plan[bool]:
        """Flush every server (the gutter pool's too); return whether all of them did."""
        flushed = Each(FlushAll(), ok, False, gutter=True)
        return then(flushed, lambda answers: all(answers.values()))

    @command
    def stats(self, *, gutter: bool = False) -> Plan[dict[str, dict[str, Any]]]:
        """Return memcached's ``stats`` of every server that answers, by node.

        ``gutter``: of the gutter pool's servers instead.  A server that is
        down, or a proxy that does not pass ``stats`` (twemproxy), is left out.
        """
        return then(Each(Stats(), stats, None, only_gutter=gutter, tolerant=True), dict)


# -- arguments: checked, and values encoded, before anything is sent -------------


def encoded(serde: Serde, kb: bytes, value: Any) -> tuple[bytes, int]:
    """``value`` as the serde encodes it for key ``kb``: ``(data, flags)``."""
    data, flags = serde.serialize(kb, value)
    # Serialisers may return an int's digits as str (pymemcache's serdes do): sent as text.
    return (data if isinstance(data, bytes) else str(data).encode()), flags


def _concatenate(verb: Literal["append", "prepend"], key: Key, value: bytes) -> Call[bool]:
    """``append``/``prepend``: raw bytes, never through the serde.

    memcached keeps the item's flags and TTL and ignores the command's, so the
    bytes are joined to the item as they are (store.py); a serde (signing,
    compression, another format) could only corrupt the item.
    """
    if not isinstance(value, bytes):
        raise TypeError(f"append/prepend take bytes, not {type(value).__name__}")
    kb, ring = placed(key)
    return Call(ring, new_store(verb, kb, value, 0, 0, None), stored, False)


def _delta(delta: int) -> int:
    if isinstance(delta, bool) or not isinstance(delta, int) or not 0 <= delta < MAX_DELTA:
        raise ValueError(f"incr/decr delta must be an integer in [0, 2**64), not {delta!r}")
    return delta


def expire_time(expire: int) -> int:
    """memcached's exptime for ``expire``; a negative one is "expired at once"."""
    if not isinstance(expire, int):
        raise ValueError(f"expire must be an integer, not {expire!r}")
    # "Expired at once" as an absolute time in 1970, which memcached treats as
    # it treats a negative exptime: twemproxy closes the connection on those.
    return EXPIRED if expire < 0 else int(expire)


def cas_token(cas: CasToken | str) -> bytes:
    """A cas token as memcached's ASCII digits: int, str or bytes (gets returns bytes)."""
    if isinstance(cas, int) and not isinstance(cas, bool) and cas >= 0:
        return b"%d" % cas
    token = cas.encode("ascii", "replace") if isinstance(cas, str) else cas
    if isinstance(token, bytes) and token.isdigit():
        return token
    raise ValueError(f"cas token must be memcached's unsigned integer, not {cas!r}")


def _claim_requests(
    serde: Serde, kb: bytes, recache: int | None, placeholder: Any, placeholder_ttl: int
) -> tuple[Request[Any], ...]:
    """``mg v c t f R<recache>``, and the placeholder's add when one is given."""
    read = MetaGet(kb, value=True, cas=True, ttl=True, client_flags=True, recache=recache)
    if placeholder is None:
        return (read,)
    data, flags = encoded(serde, kb, placeholder)
    ttl = expire_time(placeholder_ttl)
    add = MetaSet(kb, data=data, mode="E", ttl=ttl, client_flags=flags, return_cas=True)
    return (read, add)


_new_meta_set = maker(MetaSet, checked=True)
"""MetaSet from its thirteen fields, positionally (MetaRequest's first): its dataclass
``__init__`` set each through ``object.__setattr__`` (some 20k instructions a request).
Its ``__post_init__`` only refuses a quiet request without an opaque token or key return:
never made here."""


def _meta_swap(kb: bytes, data: bytes, flags: int, token: bytes, expire: int) -> MetaSet:
    """``ms <key> C<cas> c``: store only if unchanged, returning the new cas."""
    # key, quiet, opaque, return_key, base64, extra, then data, mode, cas, ttl, client_flags,
    # invalidate, return_cas (tests/core/test_compiled.py holds it to MetaSet(...))
    return _new_meta_set(
        kb,
        False,
        None,
        False,
        False,
        (),
        data,
        None,
        int(token),
        expire_time(expire),
        flags,
        False,
        True,
    )


def _nothing(_: object) -> None:
    return None
