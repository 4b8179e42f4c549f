"""Continuum routes every key exactly as the real peers do, on real memcached servers.

Method: write >= 10,000 keys through the peer (pylibmc built against Debian's
libmemcached 1.1.4, or nutcracker 0.5.0), ask each memcached server directly
which keys it holds, and require :meth:`Continuum.get_node` to name that server
for 100% of the keys.  The servers are started once for the module; one of them
listens on 11211 when that port is free, so the "port omitted from the label"
rule of libmemcached and twemproxy is exercised too.  Ties (two servers sharing
a point) use real MD5 collisions found by a birthday search.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
from pymemcache.client.base import Client

from django_mcpatterns.core.ketama import Continuum
from django_mcpatterns.core.keys import key_bytes
from tests.harness import (
    LOOPBACK,
    MemcachedServer,
    free_port,
    port_is_free,
    require_binary,
    require_module,
)
from tests.processes import MEMCACHED_STOP, ServerProcess

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEY_COUNT = 10_000
SIZES = (3, 5, 10)
# [4, 8, 5, 1, 7] is the float32 edge case: the first server gets 124 points, not 128.
WEIGHTS = (4, 8, 5, 1, 7, 2, 3, 9, 6, 1)
# With 25 equal weights, pct * 160 / 4 * 25 is 39.999996 in float32: 156 points each.
EQUAL_WEIGHT_EDGE = 25
CHUNK = 500
WRITERS = 4  # pylibmc waits for each reply: parallel clients make the writes ~2x faster

# Labels whose MD5 points collide, with a key that hashes just below the shared
# point (so it belongs to whichever server owns that point).
NAME_TIES = [  # as twemproxy server names
    ("10.0.218.1:11300", "10.2.23.1:11300", b"tie-85"),
    ("10.101.181.1:11300", "10.101.222.1:11300", b"tie-26"),
]
PORT_TIES = [  # "127.0.0.1:<port>" labels; the first pair whose ports are free is used
    (20074, 20289, b"tie-1854"),
    (20009, 20757, b"tie-776"),
    (20303, 20824, b"tie-532"),
    (20323, 21074, b"tie-56"),
]


# -- keys -----------------------------------------------------------------------


def _make_keys(count: int, seed: int = 1121) -> list[bytes]:
    """Valid memcached keys of every shape a router must hash the same way.

    ASCII, exactly 250 bytes, accented/Cyrillic/CJK text, emoji and punctuation,
    UTF-8 encoded (bytes >= 0x80 are where sign-extending hashes differ).
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    punctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    unicode = "éèàüößçñøå" + "ключзначение" + "鍵値缓存日本語" + "αβγδ" + "ﬁ€™"
    emoji = "😀😎🚀🔥🎉👍🏽🧪🦄"

    def text(alphabet: str, length: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(length))

    makers: list[Callable[[int], str]] = [
        lambda i: f"user:{i}:{text(letters, rng.randint(1, 30))}",
        lambda i: f"{i}:" + text(letters + punctuation, 250 - len(f"{i}:")),
        lambda i: f"{i}:{text(unicode, rng.randint(1, 40))}",
        lambda i: f"{i}:{text(emoji + letters, rng.randint(1, 30))}",
        lambda i: f"{i}{text(punctuation, rng.randint(1, 60))}",
        lambda i: f"{i}:" + text(unicode + emoji + punctuation, 60),
    ]
    keys = [makers[i % len(makers)](i).encode() for i in range(count)]
    keys += [key for *_, key in NAME_TIES + PORT_TIES]
    for key in keys:
        assert key_bytes(key) == key  # valid memcached keys only
    assert len(set(keys)) == len(keys)
    return keys


KEYS = _make_keys(KEY_COUNT)


# -- servers --------------------------------------------------------------------

Address = str | tuple[str, int]


def _start_all(servers: list[MemcachedServer]) -> list[MemcachedServer]:
    """Start servers in parallel (25 one after another take seconds), or none."""
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(server.start) for server in servers]
    try:
        for future in futures:
            future.result()
    except BaseException:
        _stop_all(servers)
        raise
    return servers


def _stop_all(servers: Sequence[MemcachedServer]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(MemcachedServer.stop, servers))


def _servers_on(ports: Sequence[int]) -> Iterator[list[MemcachedServer]]:
    require_binary("memcached")
    servers = _start_all([MemcachedServer(port, extra_args=("-t", "1")) for port in ports])
    try:
        yield servers
    finally:
        _stop_all(servers)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[MemcachedServer]]:
    """25 memcached servers, the second one on 11211 when that port is free."""
    ports = [free_port(), 11211] if port_is_free(11211) else []
    while len(ports) < EQUAL_WEIGHT_EDGE:
        port = free_port()
        if port not in ports:
            ports.append(port)
    yield from _servers_on(ports)


@pytest.fixture(scope="module")
def colliding_servers() -> Iterator[tuple[list[MemcachedServer], bytes]]:
    """Two servers whose "127.0.0.1:port" labels share an MD5 point, and the key there."""
    for first, second, key in PORT_TIES:
        if port_is_free(first) and port_is_free(second):
            for pair in _servers_on([first, second]):
                yield pair, key
            return
    pytest.skip("none of the colliding port pairs is free on this machine")


@pytest.fixture(scope="module")
def socket_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Address]]:
    """Three memcached servers on unix sockets: node (the path) -> address (the path)."""
    binary = require_binary("memcached")
    directory = tmp_path_factory.mktemp("sockets")
    executors: list[ServerProcess] = []
    try:
        for i in range(3):
            path = str(directory / f"mc{i}.sock")
            command = [binary, "-s", path, "-m", "64", "-t", "1"]
            if os.geteuid() == 0:
                command += ["-u", "root"]  # memcached refuses to run as root without -u
            executors.append(
                ServerProcess(command, path, name="memcached", stop_signal=MEMCACHED_STOP)
            )
            executors[-1].start()
        yield {str(e.address): str(e.address) for e in executors}
    finally:
        for executor in executors:
            executor.stop()


@pytest.fixture(scope="module")
def pylibmc() -> ModuleType:
    return require_module(
        "pylibmc", "pip install --no-binary pylibmc pylibmc, against apt's libmemcached-dev"
    )


@pytest.fixture(scope="module")
def nutcracker_bin() -> str:
    return require_binary("nutcracker")


def _tcp(servers: Sequence[MemcachedServer]) -> dict[str, Address]:
    return {s.spec: (LOOPBACK, s.port) for s in servers}


def _flushed(addresses: dict[str, Address]) -> dict[str, Address]:
    for address in addresses.values():
        client = Client(address, timeout=10)
        client.flush_all(noreply=False)
        client.close()
    return addresses


def _locate(addresses: dict[str, Address]) -> dict[bytes, str]:
    """Ask every server (node -> address) directly which of the keys it holds."""
    where: dict[bytes, str] = {}
    for node, address in addresses.items():
        client = Client(address, timeout=10)
        try:
            pending = [k for k in KEYS if k not in where]
            for start in range(0, len(pending), CHUNK):
                for key in client.get_many(pending[start : start + CHUNK]):
                    assert key not in where, f"{key!r} is on two servers"
                    where[key] = node
        finally:
            client.close()
    assert len(where) == len(KEYS), f"only {len(where)} of {len(KEYS)} keys were stored"
    return where


def _assert_agreement(ring: Continuum, where: dict[bytes, str]) -> None:
    wrong = [(k, where[k], node) for k in KEYS if (node := ring.get_node(k)) != where[k]]
    assert not wrong, (
        f"{len(wrong)} of {len(KEYS)} keys routed differently from the peer, e.g. {wrong[:3]}"
    )


def _chunks(keys: Sequence[bytes]) -> Iterator[dict[bytes, bytes]]:
    for start in range(0, len(keys), CHUNK):
        yield dict.fromkeys(keys[start : start + CHUNK], b"1")


# -- pylibmc (libmemcached 1.1.4) ------------------------------------------------

PYLIBMC_BEHAVIORS = {
    "libmemcached": {"ketama_weighted": True},
    "libmemcached-ketama": {"ketama": True},
}


def _write_pylibmc(pylibmc: ModuleType, specs: Sequence[str], variant: str) -> None:
    """Write KEYS through pylibmc clients (one per thread: a client is not thread-safe)."""

    def write(keys: Sequence[bytes]) -> None:
        client = pylibmc.Client(list(specs), behaviors=PYLIBMC_BEHAVIORS[variant])
        try:
            for chunk in _chunks(keys):
                failed = client.set_multi(chunk)
                assert not failed, f"pylibmc could not store {failed[:3]}"
        finally:
            client.disconnect_all()

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(write, [KEYS[i::WRITERS] for i in range(WRITERS)]))


def _check_pylibmc(
    pylibmc: ModuleType, servers: Sequence[MemcachedServer], variant: str, weights: list[int]
) -> dict[bytes, str]:
    addresses = _flushed(_tcp(servers))
    specs = [f"{s.spec}:{w}" for s, w in zip(servers, weights, strict=True)]  # host:port:weight
    _write_pylibmc(pylibmc, specs, variant)
    where = _locate(addresses)
    _assert_agreement(Continuum(list(addresses), weights=weights, variant=variant), where)
    return where


@pytest.mark.parametrize("variant", list(PYLIBMC_BEHAVIORS))
@pytest.mark.parametrize("weighted", [False, True], ids=["equal", "weighted"])
@pytest.mark.parametrize("size", SIZES)
def test_pylibmc_routes_like_continuum(pylibmc, servers, variant, weighted, size):
    weights = list(WEIGHTS[:size]) if weighted else [1] * size
    _check_pylibmc(pylibmc, servers[:size], variant, weights)


def test_pylibmc_equal_weights_float32_edge(pylibmc, servers):
    """25 equal weights: libmemcached's float32 maths gives 39 digests, not 40."""
    _check_pylibmc(pylibmc, servers, "libmemcached", [1] * EQUAL_WEIGHT_EDGE)


@pytest.mark.parametrize("variant", list(PYLIBMC_BEHAVIORS))
def test_pylibmc_unix_sockets(pylibmc, socket_servers, variant):
    """libmemcached labels a socket "path:0" (its port field is 0)."""
    _write_pylibmc(pylibmc, list(_flushed(socket_servers)), variant)
    _assert_agreement(Continuum(list(socket_servers), variant=variant), _locate(socket_servers))


@pytest.mark.parametrize("reverse", [False, True], ids=["listed", "reversed"])
def test_pylibmc_gives_equal_points_to_the_first_listed_server(pylibmc, colliding_servers, reverse):
    pair, key = colliding_servers
    order = pair[::-1] if reverse else pair
    where = _check_pylibmc(pylibmc, order, "libmemcached", [1, 1])
    assert where[key] == order[0].spec


# -- nutcracker (twemproxy 0.5.0) ------------------------------------------------

NUTCRACKER_HASHES = {"twemproxy": "md5", "twemproxy-fnv1a_64": "fnv1a_64"}


def _write_nutcracker(binary: str, tmp_path: Path, variant: str, lines: Sequence[str]) -> None:
    """Write KEYS through a nutcracker whose pool has ``lines`` as its servers."""
    port, stats_port = free_port(), free_port()
    config = tmp_path / "nutcracker.yml"
    config.write_text(
        "pool:\n"
        f"  listen: {LOOPBACK}:{port}\n"
        f"  hash: {NUTCRACKER_HASHES[variant]}\n"
        "  distribution: ketama\n"
        "  auto_eject_hosts: false\n"
        "  timeout: 5000\n"
        "  servers:\n" + "".join(f"    - {line}\n" for line in lines)
    )
    command = [binary, "-c", str(config), "-a", LOOPBACK, "-s", str(stats_port)]
    command += ["-o", str(tmp_path / "nutcracker.log"), "-p", str(tmp_path / "nutcracker.pid")]
    proxy = ServerProcess(command, (LOOPBACK, port), name="nutcracker")
    proxy.start()
    try:
        client = Client((LOOPBACK, port), timeout=10)
        for chunk in _chunks(KEYS):
            failed = client.set_many(chunk, noreply=False)
            assert not failed, f"nutcracker could not store {failed[:3]}"
        client.close()
    finally:
        proxy.stop()


def _check_nutcracker(
    binary: str,
    tmp_path: Path,
    servers: Sequence[MemcachedServer],
    variant: str,
    weights: list[int],
    names: Sequence[str] | None = None,
) -> dict[bytes, str]:
    addresses = _flushed(_tcp(servers))
    lines = [f"{s.spec}:{w}" for s, w in zip(servers, weights, strict=True)]  # host:port:weight
    if names:
        lines = [f"{line} {name}" for line, name in zip(lines, names, strict=True)]  # [name]
    _write_nutcracker(binary, tmp_path, variant, lines)
    ring = Continuum(list(addresses), weights=weights, variant=variant, names=names)
    where = _locate(addresses)
    _assert_agreement(ring, where)
    return where


@pytest.mark.parametrize("variant", list(NUTCRACKER_HASHES))
@pytest.mark.parametrize("mode", ["equal", "weighted", "named"])
@pytest.mark.parametrize("size", SIZES)
def test_nutcracker_routes_like_continuum(nutcracker_bin, servers, tmp_path, variant, mode, size):
    weights = [1] * size if mode == "equal" else list(WEIGHTS[:size])
    names = [f"cache-{chr(ord('a') + i)}" for i in range(size)] if mode == "named" else None
    _check_nutcracker(nutcracker_bin, tmp_path, servers[:size], variant, weights, names)


def test_nutcracker_equal_weights_float32_edge(nutcracker_bin, servers, tmp_path):
    _check_nutcracker(nutcracker_bin, tmp_path, servers, "twemproxy", [1] * EQUAL_WEIGHT_EDGE)


@pytest.mark.parametrize("variant", list(NUTCRACKER_HASHES))
def test_nutcracker_unix_sockets(nutcracker_bin, socket_servers, tmp_path, variant):
    """nutcracker labels a socket "path:" (the name keeps the ':' of an absent port)."""
    lines = [f"{path}:1" for path in _flushed(socket_servers)]  # path:weight
    _write_nutcracker(nutcracker_bin, tmp_path, variant, lines)
    _assert_agreement(Continuum(list(socket_servers), variant=variant), _locate(socket_servers))


@pytest.mark.parametrize(("first", "second", "key"), NAME_TIES, ids=["lengths", "bytes"])
@pytest.mark.parametrize("reverse", [False, True], ids=["listed", "reversed"])
def test_nutcracker_gives_equal_points_to_the_first_name_in_its_sort(
    nutcracker_bin, servers, tmp_path, first, second, key, reverse
):
    """nutcracker sorts servers by name (shorter, then bytewise) whatever the config order."""
    names = [second, first] if reverse else [first, second]
    where = _check_nutcracker(nutcracker_bin, tmp_path, servers[:2], "twemproxy", [1, 1], names)
    winner = min(names, key=lambda name: (len(name), name))
    assert where[key] == servers[names.index(winner)].spec


@pytest.mark.parametrize("reverse", [False, True], ids=["listed", "reversed"])
def test_nutcracker_gives_equal_points_to_the_first_address_in_its_sort(
    nutcracker_bin, colliding_servers, tmp_path, reverse
):
    pair, key = colliding_servers
    order = pair[::-1] if reverse else pair
    where = _check_nutcracker(nutcracker_bin, tmp_path, order, "twemproxy", [1, 1])
    assert where[key] == min(pair, key=lambda s: s.spec).spec  # same length: bytewise
