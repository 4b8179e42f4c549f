"""Ketama consistent hashing, bit for bit with the implementations people deploy.

"Ketama" names a family, not one algorithm: the C library, libmemcached, twemproxy
and spymemcached hash different point strings, put different numbers of points
on the ring, do weight maths in float32 and break ties differently.  A mixed fleet
shares one cluster only if every client maps every key to the same server, so
:class:`Continuum` reproduces each variant exactly (``shared/ketama-spec.md``
records the source files and the checks against the running code):

``"libmemcached"`` (default)
    libmemcached ``KETAMA_WEIGHTED`` (pylibmc ``{"ketama_weighted": True}``, PHP
    ``OPT_LIBKETAMA_COMPATIBLE``): label ``host-N`` when the port is 11211, else
    ``host:port-N``; 40 MD5 digests x 4 points per server scaled by the float32
    weight formula; key hash ``le32(md5(key))``; equal points: lowest server index.
``"libmemcached-ketama"``
    pylibmc ``{"ketama": True}``: Jenkins one-at-a-time over sign-extended bytes
    for keys *and* points, 100 points (``label-0`` .. ``label-99``).  Any weight
    > 1 switches libmemcached to the weighted MD5 points of ``"libmemcached"``
    while keys keep the one-at-a-time hash.
``"libketama"``
    RJ/ketama (Last.fm): label is the node string as given (``host:port-k``, port
    always), ``ks = floorf(f32(m/W) * 40.0 * n)`` digests; equal points: first listed.
``"twemproxy"`` / ``"twemproxy-fnv1a_64"``
    nutcracker ``distribution: ketama`` with ``hash: md5`` / ``hash: fnv1a_64``
    (a 32-bit FNV-1a over sign-extended bytes).  Labels are the server names when
    given, else as libmemcached; points are always MD5.  nutcracker sorts its
    servers by label (shorter first, then bytewise), so that order, not the
    configuration's, decides who owns an equal point.
``"spymemcached"``
    ``KetamaConnectionFactory`` (2.5+): label ``ip:port`` (port always), 40
    digests x 4 points; the weight formula only when weights are given; a later
    server overwrites an equal point (``TreeMap.put``).

Every variant looks a key up the same way: the first point >= the key's hash,
wrapping to the first point.  Keys are ``str`` (routed on their UTF-8 bytes) or
``bytes`` -- the final bytes sent to memcached.

Nodes are ``"host:port"``, ``"host"`` (port 11211), ``"[v6addr]:port"`` or a unix
socket path (``"/run/mc.sock"``, ``"unix:/run/mc.sock"``).  Socket labels follow
the peers (checked against pylibmc and nutcracker): libmemcached ``path:0`` (its
port field is 0), twemproxy ``path:``, libketama the node string, spymemcached
(which has no sockets) the path.  IPv6 hosts lose their brackets in libmemcached
labels (pylibmc hands libmemcached the bare address) and keep them elsewhere;
Java prints IPv6 in full form, so write it that way to match spymemcached.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .client.servers import DEFAULT_PORT, Server, parse_server
from .exceptions import ConfigurationError

VARIANTS = (
    "libmemcached",
    "libmemcached-ketama",
    "libketama",
    "twemproxy",
    "twemproxy-fnv1a_64",
    "spymemcached",
)

RING_SIZE = 2**32
_MASK = 0xFFFFFFFF
try:
    # CPython's built-in MD5 is twice as fast as OpenSSL's for short keys (no
    # EVP context to set up per call), and the key hash is most of a lookup.
    from _md5 import md5 as _md5  # type: ignore[import-not-found]  # CPython-private, no stub
except ImportError:  # pragma: no cover - other interpreters
    _md5 = hashlib.md5
_le32: Callable[[bytes], tuple[int]] = struct.Struct("<I").unpack_from
_le32x4 = struct.Struct("<4I").unpack
_F32 = struct.Struct("<f")

# The C and Java code reads key bytes through a signed ``char``: bytes >= 0x80
# enter one-at-a-time and FNV sign-extended to 0xFFFFFFxx.
_SIGNED = tuple(b | 0xFFFFFF00 if b & 0x80 else b for b in range(256))


# -- key hashes ---------------------------------------------------------------


def md5_hash(key: bytes) -> int:
    """``le32(md5(key), 0)``: the ketama key hash of every MD5 variant."""
    return _le32(_md5(key).digest())[0]


def one_at_a_time_hash(key: bytes) -> int:
    """Jenkins one-at-a-time as libhashkit computes it (sign-extended bytes)."""
    h = 0
    for byte in key:
        h = (h + _SIGNED[byte]) & _MASK
        h = (h + (h << 10)) & _MASK
        h ^= h >> 6
    h = (h + (h << 3)) & _MASK
    h ^= h >> 11
    return (h + (h << 15)) & _MASK


def fnv1a_64_hash(key: bytes) -> int:
    """twemproxy's ``fnv1a_64``: FNV-1a with the low 32 bits of the 64-bit constants."""
    h = 0x84222325  # (uint32_t) 0xcbf29ce484222325
    for byte in key:
        h = ((h ^ _SIGNED[byte]) * 0x1B3) & _MASK  # (uint32_t) 0x100000001b3
    return h


def _twemproxy_key_hash(hash_fn: Callable[[bytes], int]) -> Callable[[bytes], int]:
    """twemproxy hashes an empty key to 0 (``server_pool_hash``) whatever ``hash:`` says."""

    def key_hash(key: bytes) -> int:
        return hash_fn(key) if key else 0

    return key_hash


# -- points -------------------------------------------------------------------


def _f32(value: float) -> float:
    """Round to float32.  One f32 operation done in double and rounded is exact."""
    rounded: float = _F32.unpack(_F32.pack(value))[0]
    return rounded


def _float_digests(weight: int, total: int, count: int) -> int:
    """MD5 digests per server in libmemcached, twemproxy and spymemcached.

    ``floor((float)(pct*160/4*(float)count + 1e-10))`` with every step in float32:
    weights [4, 8, 5, 1, 7] give the first server 31.999998 -> 31 digests, not 32.
    The ``+ 1e-10`` never changes a float32 of this size (spec, section 2).
    """
    pct = _f32(_f32(weight) / _f32(total))
    per = _f32(_f32(_f32(pct * 160) / 4) * _f32(count))
    return math.floor(_f32(per + 1e-10))


def _libketama_digests(weight: int, total: int, count: int) -> int:
    """``floorf(pct * 40.0 * (float)n)``: the product in double, rounded to float by floorf."""
    pct = _f32(_f32(weight) / _f32(total))
    return math.floor(_f32(pct * 40.0 * count))


def _md5_points(label: str, digests: int) -> list[int]:
    """Four little-endian words of ``md5("label-N")`` for N = 0 .. digests-1."""
    points: list[int] = []
    for n in range(digests):
        points.extend(_le32x4(_md5(f"{label}-{n}".encode()).digest()))
    return points


def _weighted_md5_points(
    digests_fn: Callable[[int, int, int], int], labels: Sequence[str], weights: Sequence[int]
) -> list[list[int]]:
    total = sum(weights)
    return [
        _md5_points(lb, digests_fn(w, total, len(labels)))
        for lb, w in zip(labels, weights, strict=True)
    ]


def _float_weighted_points(labels: Sequence[str], weights: Sequence[int] | None) -> list[list[int]]:
    """libmemcached ``KETAMA_WEIGHTED`` and twemproxy: always the float formula."""
    return _weighted_md5_points(_float_digests, labels, weights or [1] * len(labels))


def _libketama_points(labels: Sequence[str], weights: Sequence[int] | None) -> list[list[int]]:
    return _weighted_md5_points(_libketama_digests, labels, weights or [1] * len(labels))


def _libmemcached_ketama_points(
    labels: Sequence[str], weights: Sequence[int] | None
) -> list[list[int]]:
    """100 one-at-a-time points per server, unless a weight > 1 turned on weighting.

    libmemcached's ``server_add`` sets ``weighted`` when a server with weight > 1
    joins a consistent distribution; ``update_continuum`` then builds the MD5 ring.
    """
    if weights and max(weights) > 1:
        return _float_weighted_points(labels, weights)
    return [[one_at_a_time_hash(f"{lb}-{n}".encode()) for n in range(100)] for lb in labels]


def _spymemcached_points(labels: Sequence[str], weights: Sequence[int] | None) -> list[list[int]]:
    """``KetamaNodeLocator``: 160 repetitions / 4; the formula only with a weight map."""
    if weights is None:
        return [_md5_points(lb, 40) for lb in labels]
    return _float_weighted_points(labels, weights)


# -- labels -------------------------------------------------------------------


def _host_as_written(server: Server) -> str:
    return f"[{server.host}]" if ":" in server.host else server.host


def _libmemcached_label(node: str, server: Server, name: str | None) -> str:
    """``host`` when the port is 11211 (``MEMCACHED_DEFAULT_PORT``), else ``host:port``.

    libmemcached stores port 0 for a unix socket, so its label is ``path:0``.
    """
    if server.port == DEFAULT_PORT:
        return server.host
    return f"{server.host}:{server.port or 0}"


def _twemproxy_label(node: str, server: Server, name: str | None) -> str:
    """The server's name, else its address, minus the port when it is 11211 (``nc_conf.c``)."""
    if name is not None:
        return name
    if server.port is None:
        # A socket line is "path:weight"; nutcracker keeps the path plus one byte
        # for the absent port's ':' (checked against nutcracker 0.5.0).
        return f"{server.host}:"
    if server.port == DEFAULT_PORT:
        return _host_as_written(server)
    return f"{_host_as_written(server)}:{server.port}"


def _spymemcached_label(node: str, server: Server, name: str | None) -> str:
    """``InetSocketAddress.toString()`` minus the leading ``/``: the port is always there."""
    return server.node


def _verbatim_label(node: str, server: Server, name: str | None) -> str:
    """libketama hashes the address exactly as the server file spells it."""
    return node


# -- ties: who owns a point two servers share ----------------------------------


def _first_listed(index: int, label: str) -> int:
    """libmemcached sorts by (value, server index); libketama's qsort is stable."""
    return index


def _last_listed(index: int, label: str) -> int:
    """spymemcached's ``TreeMap.put``: a later node overwrites the point."""
    return -index


def _shortest_label(index: int, label: str) -> tuple[int, bytes]:
    """twemproxy sorts its servers by name before building the ring.

    ``conf_validate_server`` sorts the pool with ``conf_server_name_cmp`` (to find
    duplicates), i.e. ``string_compare``: shorter name first, then ``strncmp``.
    The ring's stable sort then gives an equal point to the first of that order,
    whatever the configuration order (checked against nutcracker 0.5.0).
    """
    raw = label.encode()
    return len(raw), raw


# -- variants -----------------------------------------------------------------

_Labeler = Callable[[str, Server, "str | None"], str]
_PointsFn = Callable[[Sequence[str], "Sequence[int] | None"], list[list[int]]]


@dataclass(frozen=True)
class _Variant:
    key_hash: Callable[[bytes], int]
    label: _Labeler
    points: _PointsFn
    tie: Callable[[int, str], object] = _first_listed  # sort key of (index, label)
    names: bool = False  # twemproxy server names replace the address in labels


_SCHEMES = {
    "libmemcached": _Variant(md5_hash, _libmemcached_label, _float_weighted_points),
    "libmemcached-ketama": _Variant(
        one_at_a_time_hash, _libmemcached_label, _libmemcached_ketama_points
    ),
    "libketama": _Variant(md5_hash, _verbatim_label, _libketama_points),
    "twemproxy": _Variant(
        _twemproxy_key_hash(md5_hash),
        _twemproxy_label,
        _float_weighted_points,
        tie=_shortest_label,
        names=True,
    ),
    "twemproxy-fnv1a_64": _Variant(
        _twemproxy_key_hash(fnv1a_64_hash),
        _twemproxy_label,
        _float_weighted_points,
        tie=_shortest_label,
        names=True,
    ),
    "spymemcached": _Variant(md5_hash, _spymemcached_label, _spymemcached_points, tie=_last_listed),
}
assert tuple(_SCHEMES) == VARIANTS


# -- validation ---------------------------------------------------------------


def _parse_node(node: object) -> Server:
    """Parse a node string; weights and names travel separately, never inside it."""
    if not isinstance(node, str):
        raise ConfigurationError(f"a node is a 'host:port' string, not {node!r}", option="LOCATION")
    server = parse_server(node)
    spellings = {server.node, _host_as_written(server)}
    if server.is_unix:
        spellings.add(f"unix:{server.host}")
    if node not in spellings or server.name is not None:
        raise ConfigurationError(
            f"invalid node {node!r}: expected 'host:port', 'host', '[v6]:port' or a socket "
            "path (pass weights and names separately)",
            option="LOCATION",
        )
    return server


def _check_weight(weight: object) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
        raise ConfigurationError(
            f"a server weight must be a positive integer, not {weight!r}", option="LOCATION"
        )
    return weight


def _check_name(name: object, variant: _Variant, variant_name: str) -> str | None:
    if name is None:
        return None
    if not variant.names:
        raise ConfigurationError(
            f"server names only apply to the twemproxy variants, not {variant_name!r}",
            option="LOCATION",
        )
    if not isinstance(name, str) or not name or name != name.strip() or " " in name:
        raise ConfigurationError(
            f"a server name is one non-empty word, not {name!r}", option="LOCATION"
        )
    return name


def _key_bytes(key: str | bytes) -> bytes:
    """The bytes a key is routed on: UTF-8 for ``str``, as memcached receives it."""
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"ketama keys are str or bytes, not {type(key).__name__}")


@dataclass(frozen=True)
class _Member:
    node: str
    server: Server
    weight: int
    name: str | None
    label: str


# -- the ring -----------------------------------------------------------------


class Continuum:
    """A ketama ring that routes keys as ``variant``'s real implementation does.

    ``Continuum(nodes, weights=None, variant="libmemcached", names=None)``:
    ``weights`` are positive integers (libketama's memory sizes); ``names`` are
    twemproxy server names (``None`` entries keep the address).  ``get_node``,
    ``add_node`` and ``remove_node`` make it a pymemcache ``HashClient`` hasher.

    The ring is rebuilt from the node list on every change (the weight maths
    depends on every server), then swapped in as one tuple, so lookups need no
    lock and always see a whole ring.  The ring equals what a peer configured
    with the current list, in the current order, computes.
    """

    def __init__(
        self,
        nodes: Iterable[str],
        weights: Sequence[int] | None = None,
        variant: str = "libmemcached",
        names: Sequence[str | None] | None = None,
    ) -> None:
        if variant not in _SCHEMES:
            raise ConfigurationError(
                f"unknown ketama variant {variant!r}; valid choices: "
                + ", ".join(repr(v) for v in VARIANTS),
                option="ketama",
                choices=VARIANTS,
            )
        self._variant = variant
        self._scheme = _SCHEMES[variant]
        self._hash = self._scheme.key_hash
        self._lock = threading.Lock()
        node_list = list(nodes)
        # spymemcached weighs servers only when it is given a weight map.
        self._weighted = weights is not None
        weight_list = [1] * len(node_list) if weights is None else list(weights)
        name_list = [None] * len(node_list) if names is None else list(names)
        for what, values in (("weights", weight_list), ("names", name_list)):
            if len(values) != len(node_list):
                raise ConfigurationError(
                    f"{len(values)} {what} for {len(node_list)} nodes", option="LOCATION"
                )
        self._members: list[_Member] = []
        for node, weight, name in zip(node_list, weight_list, name_list, strict=True):
            self._members.append(self._member(node, weight, name, self._members))
        self._ring: tuple[list[int], list[str]] = ([], [])
        self._rebuild()

    # -- lookups (hot path) --

    def get_node(self, key: str | bytes) -> str:
        """Return the node (as given) that owns ``key``: the first point >= its hash."""
        points, owners = self._ring
        # Exact-type checks keep str and bytes keys off the general (slower) path.
        if key.__class__ is str:
            key = key.encode()
        elif key.__class__ is not bytes:
            key = _key_bytes(key)
        try:
            # owners has one extra entry, owners[0] again: a hash above the last
            # point wraps to the first without a branch.
            return owners[bisect_left(points, self._hash(key))]
        except IndexError:
            raise ConfigurationError("the ketama ring has no nodes") from None

    def get_nodes(self, key: str | bytes, n: int) -> list[str]:
        """Return up to ``n`` distinct nodes in ring order from ``key``'s point.

        The first is :meth:`get_node`'s answer; the rest are where a replica or a
        failover walk goes next.  Fewer than ``n`` come back when the ring has fewer.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, not {n!r}")
        points, owners = self._ring
        if not points:
            raise ConfigurationError("the ketama ring has no nodes")
        start = bisect_left(points, self._hash(_key_bytes(key)))
        wanted = min(n, len(self._members))
        found: list[str] = []
        if not wanted:
            return found
        size = len(points)
        for i in range(start, start + size):
            node = owners[i % size]
            if node not in found:
                found.append(node)
                if len(found) == wanted:
                    break
        return found

    # -- pymemcache hasher interface --

    def add_node(self, node: str, weight: int = 1, name: str | None = None) -> None:
        """Append ``node``: last in server order, which decides who owns equal points."""
        with self._lock:
            member = self._member(node, weight, name, self._members)
            self._members.append(member)
            if weight != 1:
                self._weighted = True
            self._rebuild()

    def remove_node(self, node: str) -> None:
        """Remove ``node``; its keys move to the next points, nobody else's move."""
        with self._lock:
            kept = [m for m in self._members if m.node != node]
            if len(kept) == len(self._members):
                raise ConfigurationError(f"node {node!r} is not in the ring", option="LOCATION")
            self._members = kept
            self._rebuild()

    # -- inspection --

    @property
    def variant(self) -> str:
        return self._variant

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes in server order, as given."""
        return tuple(m.node for m in self._members)

    @property
    def weights(self) -> tuple[int, ...]:
        return tuple(m.weight for m in self._members)

    def shares(self) -> dict[str, float]:
        """Each node's fraction of the 2**32 hash space, in server order.

        A node owns the hashes in ``(previous point, its point]``; the first point
        also owns the wrap-around arc.  Fractions sum to 1 (a node can own 0).
        """
        points, owners = self._ring
        owned = dict.fromkeys(self.nodes, 0)
        previous = points[-1] - RING_SIZE if points else 0
        for point, owner in zip(points, owners, strict=False):  # owners ends with a wrap entry
            owned[owner] += point - previous
            previous = point
        return {node: count / RING_SIZE for node, count in owned.items()}

    def point_counts(self) -> dict[str, int]:
        """Each node's number of points on the ring, in server order (0 is possible)."""
        counts = dict.fromkeys(self.nodes, 0)
        for owner in self._ring[1][:-1]:  # the last entry is the wrap-around copy
            counts[owner] += 1
        return counts

    def points(self) -> list[tuple[int, str]]:
        """Return the ring as ``(point, node)`` pairs in hash order.

        A key goes to the first point >= its hash, wrapping past the last point
        to the first.  Of equal points, the first listed is the one lookups take.
        """
        points, owners = self._ring
        return list(zip(points, owners, strict=False))  # owners ends with a wrap entry

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node: object) -> bool:
        return any(m.node == node for m in self._members)

    def __repr__(self) -> str:
        return f"Continuum({list(self.nodes)!r}, variant={self._variant!r})"

    # -- construction --

    def _member(
        self, node: str, weight: object, name: object, existing: Sequence[_Member]
    ) -> _Member:
        server = _parse_node(node)
        weight = _check_weight(weight)
        name = _check_name(name, self._scheme, self._variant)
        label = self._scheme.label(node, server, name)
        for other in existing:
            if other.node == node:
                raise ConfigurationError(f"node {node!r} is listed twice", option="LOCATION")
            if other.label == label:
                raise ConfigurationError(
                    f"nodes {other.node!r} and {node!r} are the same ketama server {label!r}",
                    option="LOCATION",
                )
        return _Member(node, server, weight, name, label)

    def _rebuild(self) -> None:
        members = self._members
        weights = [m.weight for m in members] if self._weighted else None
        per_node = self._scheme.points([m.label for m in members], weights)
        # Equal points go to the server whose tie key sorts first (see _first_listed,
        # _last_listed, _shortest_label); lookups take the leftmost equal point.
        tie = self._scheme.tie
        entries = sorted(
            (point, tie(index, member.label), member.node)
            for index, (member, points) in enumerate(zip(members, per_node, strict=True))
            for point in points
        )
        points = [entry[0] for entry in entries]
        owners = [entry[2] for entry in entries]
        if owners:
            owners.append(owners[0])
        self._ring = (points, owners)
