"""What a reply means for the command that got it: the judgments every command shares.

A command's reply is one of the outcomes its command may have (stored or not,
deleted or missing, a number...), one of memcached's error replies, which are
the caller's errors (:func:`reply_error`: too large, non-numeric, unknown
command), or a mismatch (:class:`~..exceptions.ProtocolError`).  Which servers
may refuse a command (meta commands on a text-only server, ``flush_all`` and
``stats`` through twemproxy) is decided here too; the drivers decide what to
do about it (:mod:`..client.outcomes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import (
    CommandNotSupportedError,
    NeedsMetaProtocolError,
    NonNumericValueError,
    ProtocolError,
    ServerError,
    ValueTooLargeError,
)
from ..observe.records import command_name
from ..store import CasToken
from .meta import MetaArithmetic, MetaDelete, MetaGet, MetaNoop, MetaSet
from .wire import (
    DELETED,
    EXISTS,
    NOT_FOUND,
    NOT_STORED,
    OK,
    STORED,
    TOUCHED,
    ErrorReply,
    FlushAll,
    MetaReply,
    Request,
    Stats,
    Value,
)

__all__ = [
    "META_REQUESTS",
    "REFUSABLE",
    "UnknownCommandError",
    "bumped_meta",
    "bumped_text",
    "cas_stored",
    "count",
    "deleted",
    "first_value",
    "identity",
    "meta_cas",
    "meta_deleted",
    "no_meta",
    "not_supported",
    "ok",
    "refused_in",
    "reply_error",
    "stats",
    "stored",
    "touched",
    "ttl_left",
    "written",
]

# Commands a text-only server may not know.  memcached before 1.6 answers a meta
# command ERROR ("a nonexistent command name", protocol.txt); twemproxy closes
# the connection on meta commands, flush_all and stats.
META_REQUESTS = (MetaGet, MetaSet, MetaDelete, MetaArithmetic, MetaNoop)
REFUSABLE = (*META_REQUESTS, FlushAll, Stats)


class UnknownCommandError(ServerError):
    """memcached's plain ``ERROR``: the command's name is unknown (protocol.txt)."""


def reply_error(reply: object) -> BaseException:
    """Our error for one of memcached's error replies: the caller's error, not the server's.

    Anything else a command's decoder was not written for is a mismatch.
    """
    if not isinstance(reply, ErrorReply):
        return ProtocolError(f"reply {reply!r} does not answer the request")
    if reply.too_large:
        # "SERVER_ERROR object too large for cache" (over -I, 1 MiB by default)
        return ValueTooLargeError(f"value too large for memcached: {reply.message}")
    if reply.non_numeric:
        # "CLIENT_ERROR cannot increment or decrement non-numeric value"
        return NonNumericValueError(reply.message)
    if reply.kind == "ERROR":
        return UnknownCommandError(f"memcached answered an error: {reply.message or reply}")
    return ServerError(f"memcached answered an error: {reply.message or reply}")


def stored(reply: bytes | ErrorReply) -> bool:
    """append/prepend: stored, or not (a missing item, or one full: ``NOT_STORED`` both)."""
    if reply is STORED or reply == STORED:
        return True
    if reply == NOT_STORED:
        return False
    raise reply_error(reply)


def written(reply: bytes | ErrorReply) -> bool:
    """A whole value's ``set``/``add``: as :func:`stored`, and "out of memory" is not stored.

    memcached could not allocate the item (``SERVER_ERROR out of memory storing
    object``, under ``-M`` or a stream of large items): certainly not stored,
    a failed write like one over the size limit, never an error for the view.
    (append/prepend keep raising: there False would mean "missing or full".)
    """
    if isinstance(reply, ErrorReply) and reply.out_of_memory:
        return False
    return stored(reply)


def cas_stored(reply: bytes | ErrorReply) -> bool | None:
    """A text ``cas``: stored, not stored (changed: ``EXISTS``), or None (missing)."""
    if isinstance(reply, ErrorReply) and reply.out_of_memory:
        return False  # not stored (see written)
    if reply == STORED:
        return True
    if reply == EXISTS:
        return False
    if reply == NOT_FOUND:
        return None
    raise reply_error(reply)


def deleted(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return reply == DELETED


def bumped_text(reply: bytes | ErrorReply) -> bool:
    # NOT_STORED: the item exists (and add moved it to the LRU's head); STORED: it did not.
    if reply == NOT_STORED:
        return True
    if reply == STORED:
        return False
    raise reply_error(reply)


def bumped_meta(reply: MetaReply | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    if reply.status not in (b"HD", b"EN"):
        raise ProtocolError(f"reply {reply!r} does not answer a flagless mg")
    return reply.status == b"HD"


def touched(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return reply == TOUCHED


def ok(reply: bytes | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return reply == OK


def count(reply: int | ErrorReply | None) -> int | None:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return reply


def ttl_left(reply: MetaReply | ErrorReply) -> int | None:
    """``mg <key> t``: the seconds left (-1: never expires), None when missing."""
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    if reply.status == b"EN":
        return None
    ttl = reply.ttl
    if reply.status != b"HD" or ttl is None:
        raise ProtocolError(f"reply {reply!r} does not answer mg t")
    return ttl


def identity(reply: Any) -> Any:
    """The reply as it came (its caller judges it)."""
    return reply


def meta_cas(reply: MetaReply | ErrorReply) -> CasToken | None:
    """An ``ms ... c`` reply: the new cas token when stored (``HD``), else None."""
    if isinstance(reply, ErrorReply):
        if reply.out_of_memory:
            return None  # not stored (see written)
        raise reply_error(reply)
    if reply.status != b"HD":
        return None  # NS (add: exists), EX (cas changed), NF (missing)
    if reply.cas is None:
        raise ProtocolError(f"reply {reply!r} does not answer ms ... c")
    return b"%d" % reply.cas


def meta_deleted(reply: MetaReply | ErrorReply) -> bool:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return reply.status == b"HD"  # EX: another version; NF: missing


def first_value(reply: list[Value] | ErrorReply) -> Value | None:
    if type(reply) is not list:
        raise reply_error(reply)
    return reply[0] if reply else None


def _stat_value(text: str) -> Any:
    """A stat as a number where memcached prints one (``item_size_max`` is used as such)."""
    if text.isdigit():
        return int(text)
    try:
        return float(text) if text[:1].isdigit() and "." in text else text
    except ValueError:
        return text


def stats(reply: dict[str, str] | ErrorReply) -> dict[str, Any]:
    if isinstance(reply, ErrorReply):
        raise reply_error(reply)
    return {name: _stat_value(value) for name, value in reply.items()}


# -- commands a server may not know ------------------------------------------------


def no_meta(batch: tuple[Request[Any], ...]) -> None:
    """Refuse a meta command in text mode (``OPTIONS['protocol'] = 'text'``), before any I/O."""
    meta = next((r for r in batch if isinstance(r, META_REQUESTS)), None)
    if meta is not None:
        raise NeedsMetaProtocolError(
            f"{command_name(meta)} is a meta command, and OPTIONS['protocol'] is 'text'",
            option="protocol",
        )


def refused_in(
    node: str, batch: tuple[Request[Any], ...], replies: Sequence[Any]
) -> CommandNotSupportedError | None:
    """The error when server ``node`` answered ``ERROR`` to a command it may not know."""
    for request, reply in zip(batch, replies, strict=True):
        refused = type(reply) is ErrorReply and reply.kind == "ERROR"
        if refused and isinstance(request, REFUSABLE):  # memcached < 1.6: meta
            return not_supported(node, request, "answered ERROR to")
    return None


def not_supported(node: str, request: Request[Any], how: str) -> CommandNotSupportedError:
    """The error for a command server ``node`` refused (``how`` it refused it)."""
    verb = command_name(request)
    if isinstance(request, META_REQUESTS):
        return CommandNotSupportedError(
            f"memcached at {node} does not speak the meta protocol (it {how} {verb}); "
            "set OPTIONS['protocol'] = 'text' for twemproxy, mcrouter or memcached before 1.6",
            node=node,
            command=verb,
            option="protocol",
        )
    return CommandNotSupportedError(
        f"memcached at {node} does not support {verb} (it {how} {verb}): a proxy such as "
        "twemproxy passes neither flush_all nor stats; send them to the servers behind it",
        node=node,
        command=verb,
    )
