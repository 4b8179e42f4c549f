"""Replies to values: the serde's decoders and the multi-key exchanges, made once per cluster.

:class:`Decoders` binds a cluster's serde (serializer, signing, soft-expiry
envelopes) to the decoders its commands' plans use, so a command makes no
closure per call.  An item the serde refuses (another client's format, a bad
signature) or a soft-expiry envelope past its time reads as a miss
(:data:`~.plans.MISS` for ``get``), and is left in place: it may be another
client's (PHP, Java, pylibmc on the same ring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pymemcache.serde import FLAG_BYTES, FLAG_TEXT

from ..exceptions import ProtocolError
from ..store import CasToken, Claimed
from ..values.envelope import STALE, Envelope
from ..values.refusals import REFUSED, is_refused
from .compiled import decoded, hits, new_get, new_store, value_decoder
from .meta import MetaDelete
from .plans import MISS
from .replies import cas_stored, first_value, meta_cas, reply_error, written
from .wire import NOT_STORED, STORED, Delete, ErrorReply, MetaReply, Request, Store, Value

__all__ = [
    "NO_CAS",
    "NO_CAS_TTL",
    "Decoders",
    "DeleteMany",
    "Fetch",
    "StoreMany",
    "claimed",
    "direct_formats",
    "hits",
    "swapped",
    "text_cas_token",
]

Serde = Any  # pymemcache's protocol: serialize(key, value), deserialize(key, data, flags)

NO_CAS: tuple[None, None] = (None, None)
NO_CAS_TTL: tuple[None, None, None] = (None, None, None)


def direct_formats(serde: Serde) -> dict[int, Callable[[bytes], Any]]:
    """The flags a serde decodes with nothing around the format (``ValueSerde.direct_formats``).

    Asked once per cluster: the hot path then decodes a plain ``bytes``, ``str``
    or ``int`` item in one call instead of the serde's layers; any other serde
    (one given by the caller) has none.
    """
    formats = getattr(serde, "direct_formats", None)
    return formats() if formats is not None else {}


class Decoders:
    """A serde's reply decoders (``value``, ``value_cas``, ``envelope_cas``) and fetches,
    and its encoder of values (:meth:`encoded`)."""

    __slots__ = (
        "direct",
        "direct_bytes",
        "direct_text",
        "envelope_cas",
        "fetch",
        "fetch_cas",
        "fetch_envelopes",
        "serde",
        "value",
        "value_cas",
    )

    def __init__(self, serde: Serde) -> None:
        self.serde = serde
        self.direct = direct_formats(serde)
        types = getattr(serde, "direct_types", None)
        bare = types() if types is not None else frozenset()
        self.direct_bytes = bytes in bare
        self.direct_text = str in bare
        self.fetch = Fetch(serde, direct=self.direct)
        self.fetch_cas = Fetch(serde, cas=True, direct=self.direct)
        self.fetch_envelopes = Fetch(serde, envelopes=True, direct=self.direct)
        # Bound once: a plan hands these to its Call on every command.
        self.value = value_decoder(self.direct, self._value, MISS)  # plain formats in C
        self.value_cas = self._value_cas
        self.envelope_cas = self._envelope_cas

    def _value(self, reply: list[Value] | ErrorReply) -> Any:
        """A ``get``: the value, or :data:`MISS` (missing, past its soft expiry, refused)."""
        if type(reply) is not list:
            raise reply_error(reply)
        if not reply:
            return MISS
        item = reply[0]
        direct = self.direct.get(item.flags)
        if direct is not None:  # a plain bytes, str or int (the serde adds nothing)
            try:
                return direct(item.data)
            except ValueError:
                pass  # not what its flags say: the serde refuses it
        value = self.serde.deserialize(item.key, item.data, item.flags)
        # Past its soft expiry, or refused (is_refused, inlined: the hot path): a miss.
        if (
            value is STALE
            or value is REFUSED
            or (type(value) is Envelope and value.value is REFUSED)
        ):
            return MISS
        return value

    def _value_cas(self, reply: list[Value] | ErrorReply) -> tuple[Any, CasToken | None]:
        if type(reply) is not list:
            raise reply_error(reply)
        if not reply:
            return NO_CAS
        item = reply[0]
        value = self.serde.deserialize(item.key, item.data, item.flags)
        if value is STALE or is_refused(value):
            return NO_CAS  # past its soft expiry, or refused (left in place): a miss
        return value, item.cas

    def _envelope_cas(self, reply: list[Value] | ErrorReply) -> tuple[Any, CasToken | None]:
        if type(reply) is not list:
            raise reply_error(reply)
        if not reply:
            return NO_CAS
        item = reply[0]
        value = self.serde.deserialize_envelope(item.key, item.data, item.flags)
        return NO_CAS if is_refused(value) else (value, item.cas)

    def encoded(self, kb: bytes, value: Any) -> tuple[bytes, int]:
        """``value`` encoded for ``kb`` (as :func:`.commands.encoded`).

        ``bytes`` as they are and a ``str`` as its UTF-8 when the serde writes
        them so (``ValueSerde.direct_types``, asked once): the serde's layers
        are skipped for the commonest values.
        """
        kind = type(value)
        if kind is bytes and self.direct_bytes:
            return value, FLAG_BYTES
        if kind is str and self.direct_text:
            try:
                return value.encode(), FLAG_TEXT
            except UnicodeEncodeError:
                pass  # lone surrogates: the serializer's own format keeps them
        data, flags = self.serde.serialize(kb, value)  # commands.encoded (which imports this)
        # Serialisers may return an int's digits as str (pymemcache's serdes do): sent as text.
        return (data if isinstance(data, bytes) else str(data).encode()), flags

    def value_cas_ttl(self, kb: bytes, reply: MetaReply | ErrorReply) -> tuple[Any, Any, Any]:
        """``mg <key> v c t f``: ``(value, cas, ttl)``, or all None on a miss."""
        if isinstance(reply, ErrorReply):
            raise reply_error(reply)
        if reply.status == b"EN":
            return NO_CAS_TTL
        if reply.status != b"VA" or reply.data is None or reply.cas is None:
            raise ProtocolError(f"reply {reply!r} does not answer mg v c t f")
        value = self.serde.deserialize(kb, reply.data, reply.client_flags or 0)
        if value is STALE or is_refused(value):
            return NO_CAS_TTL
        return value, b"%d" % reply.cas, reply.ttl


# -- multi-key exchanges (plans.Exchange) --------------------------------------------
#
# get/gets answer VALUE blocks ended by END; each storage command and each delete
# answers exactly one line.


class Fetch:
    """``get``/``gets`` of one server's keys; the result is its hits by key, decoded.

    ``direct``: the serde's :func:`direct_formats`.
    """

    __slots__ = ("cas", "direct", "envelopes", "serde")

    def __init__(
        self,
        serde: Serde,
        cas: bool = False,
        envelopes: bool = False,
        direct: Mapping[int, Callable[[bytes], Any]] | None = None,
    ) -> None:
        self.serde = serde
        self.cas = cas
        self.envelopes = envelopes  # soft-expiry envelopes as Envelope (get_many_envelopes)
        self.direct = direct if direct is not None else direct_formats(serde)

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        return (new_get(kbs, self.cas),)

    def result(self, replies: list[Any], kbs: list[bytes]) -> dict[bytes, Any]:
        (reply,) = replies
        if type(reply) is not list:
            raise reply_error(reply)
        serde = self.serde
        deserialize = serde.deserialize_envelope if self.envelopes else serde.deserialize
        return decoded(reply, self.direct, deserialize, self.cas)

    def failed(self, kbs: list[bytes]) -> dict[bytes, Any]:
        return {}


class StoreMany:
    """``set`` per key; the result is the keys that were not stored.

    Over the size limit memcached swallows the data, drops the old item and
    answers ``SERVER_ERROR object too large for cache``: the stream stays in
    step, and that key simply failed.  So does a key memcached had no memory
    for (``SERVER_ERROR out of memory storing object``): not stored, certainly.
    """

    __slots__ = ("expire", "values")

    def __init__(self, values: Mapping[bytes, tuple[bytes, int]], expire: int) -> None:
        self.values = values  # encoded: (data, flags)
        self.expire = expire

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        values, expire = self.values, self.expire
        return [new_store("set", kb, *values[kb], expire, None) for kb in kbs]

    def result(self, replies: list[Any], kbs: list[bytes]) -> list[bytes]:
        not_stored: list[bytes] = []
        for kb, reply in zip(kbs, replies, strict=True):
            if reply == STORED:
                continue
            refused = isinstance(reply, ErrorReply) and (reply.too_large or reply.out_of_memory)
            if reply == NOT_STORED or refused:
                not_stored.append(kb)
                continue
            raise reply_error(reply)
        return not_stored

    def failed(self, kbs: list[bytes]) -> list[bytes]:
        return list(kbs)


class DeleteMany:
    """``delete`` per key; nothing to answer but memcached's errors."""

    __slots__ = ()

    def requests(self, kbs: list[bytes]) -> Sequence[Request[Any]]:
        return [Delete(kb) for kb in kbs]

    def result(self, replies: list[Any], kbs: list[bytes]) -> None:
        for reply in replies:
            if isinstance(reply, ErrorReply):
                raise reply_error(reply)

    def failed(self, kbs: list[bytes]) -> None:
        return None


# -- the replies of multi-request owner primitives ----------------------------------


def text_cas_token(
    write: Store, replies: Sequence[Any], data: bytes, flags: int
) -> CasToken | None:
    """The cas of the item a text write and its ``gets`` (one write) read back, else None."""
    reply, read = replies
    done = cas_stored(reply) if write.command == "cas" else written(reply)
    item = first_value(read)
    if not done or item is None or (item.data, item.flags) != (data, flags):
        return None  # not stored, or replaced between the two commands
    return item.cas


def claimed(serde: Serde, kb: bytes, replies: Sequence[Any]) -> Claimed:
    """Decode the replies to a claim's ``mg v c f t R`` (and its placeholder's add)."""
    read = replies[0]
    added = meta_cas(replies[1]) if len(replies) > 1 else None
    if isinstance(read, ErrorReply):
        raise reply_error(read)
    if read.status == b"EN":
        return Claimed(None, None, added=added)
    if read.status != b"VA" or read.data is None or read.cas is None:
        raise ProtocolError(f"reply {read!r} does not answer mg v c f t")
    found = serde.deserialize_envelope(kb, read.data, read.client_flags or 0)
    if is_refused(found):
        return Claimed(None, None, added=added)
    return Claimed(found, b"%d" % read.cas, read.won, read.lost, read.stale, added, read.ttl)


def swapped(
    kb: bytes, reply: MetaReply | ErrorReply | None
) -> tuple[bool | None, MetaDelete | None]:
    """cas_stale's verdict on its swap, and the ``md I`` of the version it wrote, if it did.

    None: the key is gone (NF); False: not swapped, or no reply (degrading view).
    """
    if reply is None:
        return False, None
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    if reply.status != b"HD":
        return (None if reply.status == b"NF" else False), None
    token = meta_cas(reply)
    assert token is not None  # HD with c: meta_cas checked the token
    return True, MetaDelete(kb, cas=int(token), invalidate=True)
