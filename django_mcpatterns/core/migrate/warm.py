"""Warm a new ring from the old one before reads switch: ``mcpatterns_warm``'s copier.

Each old server lists its keys (``lru_crawler metadump hash``: key, expiry,
size).  A key whose server on the new ring is another is copied there with the
TTL it has left, in batches, at a bounded rate, by the steps of
:class:`~._model.Copy`: a lease placeholder on the new ring, then the old item
read, then a ``cas`` filling the placeholder.  So:

* a delete during the copy never resurrects a value: deletes run on the old
  ring first, then the new one (every process of the ``"old"`` stage does so),
  and either the old read misses or the placeholder is gone before the fill;
* a value already on the new ring is never overwritten (the placeholder's
  ``add`` fails): a second run skips what the first copied;
* only plain values are copied: an item whose flags are not a serializer's
  value (raw bytes, numbers, soft-expiry envelopes, chunk manifests, another
  client's format) may be a pattern's state (a set or list, a lock's token,
  a counter, a namespace version, a rate-limit slot, an ORM stamp), which
  stays on the old ring for the whole migration, and is skipped.

Synchronous: it runs in a management command (or Flask's CLI), not in a server.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from pymemcache.serde import FLAG_PICKLE, FLAG_TEXT

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ClusterError
from django_mcpatterns.core.leases import PLACEHOLDER, PLACEHOLDER_TTL
from django_mcpatterns.core.protocol.commands import encoded
from django_mcpatterns.core.protocol.meta import MetaGet
from django_mcpatterns.core.protocol.wire import Get, MetaReply, Request
from django_mcpatterns.core.values.compression import FLAG_ZLIB, FLAG_ZSTD
from django_mcpatterns.core.values.serializers import FLAG_JSON, FLAG_MSGPACK
from django_mcpatterns.core.values.signing import FLAG_SIGNED

from ._model import Copy, Item, copy_expire

__all__ = ["PLAIN_FLAGS", "DumpEntry", "WarmError", "WarmStats", "Warmer", "is_plain", "metadump"]

PLAIN_FLAGS = frozenset({FLAG_TEXT, FLAG_PICKLE, FLAG_JSON, FLAG_MSGPACK})
"""Flags of a serializer's value: what a warm-up copies (compressed or signed too)."""

BATCH = 100  # keys per request batch to one server
BUSY_RETRIES = 30  # a crawler already running elsewhere: wait and ask again
DUMP_WAITS = 30  # I/O timeouts in a row a dump may take (a loaded server pauses)


class WarmError(ClusterError):
    """An old server could not list its keys (``lru_crawler`` disabled, busy, or gone)."""


def is_plain(flags: int) -> bool:
    """Whether an item with these client flags is a plain cached value (see the module)."""
    return flags & ~(FLAG_SIGNED | FLAG_ZLIB | FLAG_ZSTD) in PLAIN_FLAGS


@dataclass(frozen=True, slots=True)
class DumpEntry:
    """One key of ``lru_crawler metadump``: its bytes, expiry (Unix time; -1: never), size."""

    key: bytes
    exp: int
    size: int


def metadump(connection: Any, walk: bytes = b"hash") -> Iterator[list[DumpEntry]]:
    """The keys a server holds, a page at a time (``lru_crawler metadump hash``).

    ``connection`` is a :class:`~django_mcpatterns.core.client.transport.Connection`
    to that server, not in a pool: the dump is read as it arrives, waiting up to
    ``DUMP_WAITS`` of the connection's I/O timeouts in a row for more (a loaded
    server pauses).  ``walk``: ``b"hash"`` walks the hash table (memcached
    1.6.11 and later), which lists every item once; ``b"all"`` walks the LRUs,
    and misses items the LRU maintainer moves between them during the walk
    (what older servers offer).
    """
    sock = connection.connect()
    sock.sendall(b"lru_crawler metadump %s\r\n" % walk)
    pending = b""
    waits = 0
    while True:
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, TimeoutError):  # the I/O timeout: the crawler is slow
            waits += 1
            if waits > DUMP_WAITS:
                raise WarmError(f"{connection.address!r} sent no more of its metadump") from None
            continue
        waits = 0
        if not chunk:
            raise WarmError(f"{connection.address!r} closed the connection during metadump")
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        page: list[DumpEntry] = []
        for raw in lines:
            line = raw.rstrip(b"\r")
            if line == b"END":
                yield page
                return
            if not line.startswith(b"key="):
                raise WarmError(f"{connection.address!r} answered metadump with {line!r}")
            page.append(_entry(line))
        if page:
            yield page


def _entry(line: bytes) -> DumpEntry:
    fields_ = dict(part.split(b"=", 1) for part in line.split(b" ") if b"=" in part)
    key = urllib.parse.unquote_to_bytes(fields_[b"key"])
    return DumpEntry(key, int(fields_.get(b"exp", b"-1")), int(fields_.get(b"size", b"0")))


@dataclass
class WarmStats:
    """What a warm-up did: items and bytes copied, and what it skipped, by reason."""

    listed: int = 0  # keys the old servers listed
    copied: int = 0
    bytes: int = 0
    in_place: int = 0  # the same server on both rings: nothing to copy
    present: int = 0  # already on the new ring (a copy, or a newer value)
    not_plain: int = 0  # raw bytes, numbers, envelopes...: maybe a pattern's state
    gone: int = 0  # expired, or deleted before it could be copied
    lost: int = 0  # a delete or a write on the new ring won the race
    failed: int = 0  # a server could not be used
    by_server: dict[str, int] = field(default_factory=dict)  # keys copied from each

    @property
    def skipped(self) -> int:
        return self.in_place + self.present + self.not_plain + self.gone + self.lost

    def as_dict(self) -> dict[str, Any]:
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        found["skipped"] = self.skipped
        return found


Progress = Callable[[int, int, WarmStats], object]


class Warmer:
    """Copies the plain items of ``old`` that ``new`` places on another server.

    ``rate``: items a second at most (None: as fast as the servers answer);
    ``progress(done, total, stats)`` is called after each batch (``total``
    from the old servers' ``curr_items``: an estimate).
    """

    def __init__(
        self,
        new: Cluster,
        old: Cluster,
        *,
        rate: float | None = None,
        batch: int = BATCH,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be a positive number of items a second, not {rate!r}")
        self.new = new
        self.old = old
        self.rate = rate
        self.batch = batch
        self.progress = progress
        self.clock = clock
        self.sleep = sleep
        serde = new.serde
        self.copy = Copy(new.text, lambda kb: encoded(serde, kb, PLACEHOLDER))
        self.stats = WarmStats()
        self._started = 0.0
        self._done = 0
        self._total = 0

    def run(self) -> WarmStats:
        """Copy every old server's items that belong elsewhere now; return what was done."""
        stats = self.old.stats()
        self._total = sum(int(s.get("curr_items", 0)) for s in stats.values())
        self._started = self.clock()
        for name, node in self.old.shared.nodes.items():
            if name not in stats:
                self.stats.failed += 1
                continue
            server_time = int(stats[name].get("time", 0))
            self._server(name, node, server_time)
        return self.stats

    def _server(self, name: str, node: Any, server_time: int) -> None:
        """Copy one old server's keys: one connection streams its dump, another reads items."""
        dump, reads = node.connect_aside(), node.connect_aside()
        try:
            walk = b"hash"
            for attempt in range(BUSY_RETRIES):
                try:
                    for page in metadump(dump, walk):
                        for start in range(0, len(page), self.batch):
                            entries = page[start : start + self.batch]
                            self._batch(name, reads, entries, server_time)
                    return
                except WarmError as exc:
                    dump.close()
                    if walk == b"hash" and "ERROR" in str(exc):
                        walk = b"all"  # a server before 1.6.11: the LRU walk
                        continue
                    if "BUSY" not in str(exc) or attempt == BUSY_RETRIES - 1:
                        raise
                    self.sleep(1.0)  # another crawler is running: ask again
        finally:
            dump.close()
            reads.close()

    def _batch(self, name: str, reads: Any, entries: list[DumpEntry], server_time: int) -> None:
        stats = self.stats
        stats.listed += len(entries)
        locate = self.new.router.locate
        todo = []
        for entry in entries:
            if entry.exp != -1 and entry.exp <= server_time:
                stats.gone += 1
            elif locate(entry.key) == name:
                stats.in_place += 1
            else:
                todo.append(entry)
        if todo:
            try:
                self._copy(name, reads, todo, server_time)
            except OSError:
                reads.close()  # mid-reply, maybe: the next batch reconnects
                stats.failed += len(todo)
        self._done += len(entries)
        self._pace()

    def _copy(self, name: str, reads: Any, entries: list[DumpEntry], server_time: int) -> None:
        stats, copy = self.stats, self.copy
        kbs = [entry.key for entry in entries]
        flags = self._flags(reads, kbs)
        plain = [kb for kb in kbs if kb in flags and is_plain(flags[kb])]
        stats.gone += sum(kb not in flags for kb in kbs)
        stats.not_plain += sum(kb in flags and not is_plain(flags[kb]) for kb in kbs)
        if not plain:
            return
        tokens = self._place(plain)
        stats.present += len(plain) - len(tokens)
        held = [kb for kb in plain if kb in tokens]
        if not held:
            return
        items = self._read(reads, held, {e.key: e.exp for e in entries}, server_time)
        now = time.time()
        for group in _by_server(held, self.new.router.locate).values():
            batch: list[Request[Any]] = []
            for kb in group:
                item = items.get(kb)
                if item is None or not is_plain(item.flags):
                    batch.append(copy.give_back(kb, tokens[kb]))
                else:
                    batch.append(copy.fill(item, tokens[kb], copy_expire(item, 1, now)))
            replies = self.new.exchange(group[0], batch)
            if replies is None:
                stats.failed += len(group)
                continue
            for kb, reply in zip(group, replies, strict=True):
                item = items.get(kb)
                if item is None or not is_plain(item.flags):
                    stats.gone += 1
                elif copy.filled(reply):
                    stats.copied += 1
                    stats.bytes += len(item.data)
                    stats.by_server[name] = stats.by_server.get(name, 0) + 1
                else:
                    stats.lost += 1

    def _flags(self, reads: Any, kbs: list[bytes]) -> dict[bytes, int]:
        """The old items' client flags (meta ``mg f``, no value sent; text ``get``)."""
        if self.new.text:
            (values,) = reads.exchange([Get(tuple(kbs))])
            return {v.key: v.flags for v in values} if type(values) is list else {}
        batch: list[Request[Any]] = [MetaGet(kb, client_flags=True) for kb in kbs]
        replies = reads.exchange(batch)
        return {
            kb: r.client_flags or 0
            for kb, r in zip(kbs, replies, strict=True)
            if type(r) is MetaReply and r.status == b"HD"
        }

    def _place(self, kbs: list[bytes]) -> dict[bytes, bytes]:
        held: dict[bytes, bytes] = {}
        for group in _by_server(kbs, self.new.router.locate).values():
            replies = self.new.exchange(group[0], self.copy.place(group, PLACEHOLDER_TTL))
            held.update(self.copy.tokens(group, replies))
        return held

    def _read(
        self, reads: Any, kbs: list[bytes], exps: dict[bytes, int], server_time: int
    ) -> dict[bytes, Item]:
        items = self.copy.items(kbs, reads.exchange(self.copy.read(kbs)))
        if not self.new.text:
            return items
        # Text mode reads no TTL: the dump's expiry, against the server's clock, says it.
        return {
            kb: Item(kb, item.data, item.flags, item.cas, _ttl(exps.get(kb, -1), server_time))
            for kb, item in items.items()
        }

    def _pace(self) -> None:
        if self.progress is not None:
            self.progress(self._done, self._total, self.stats)
        rate = self.rate
        if rate is None:
            return
        ahead = self._done / rate - (self.clock() - self._started)
        if ahead > 0:
            self.sleep(ahead)


def _ttl(exp: int, server_time: int) -> int:
    return -1 if exp == -1 else max(exp - server_time, 1)


def _by_server(kbs: list[bytes], locate: Callable[[bytes], str]) -> dict[str, list[bytes]]:
    groups: dict[str, list[bytes]] = {}
    for kb in kbs:
        groups.setdefault(locate(kb), []).append(kb)
    return groups
