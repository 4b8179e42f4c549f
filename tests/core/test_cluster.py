"""Cluster on real memcached: semantics, routing, pipelined fan-out, threads, sharing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pymemcache import HashClient
from pymemcache.client.base import Client
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.cluster import (
    Cluster,
    NodeEvent,
    reset_shared_clusters,
    shared_cluster,
)
from django_mcpatterns.core.exceptions import (
    ConfigurationError,
    InvalidKeyError,
    NonNumericValueError,
    ValueTooLargeError,
)
from django_mcpatterns.core.ketama import Continuum
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import FLAG_JSON, ValueRefused
from django_mcpatterns.core.servers import Server
from django_mcpatterns.core.store import Store
from tests.conftest import flush
from tests.harness import (
    PATIENCE,
    MemcachedServer,
    cluster_on,
    free_port,
    raw_client,
    require_binary,
)

# -- a socket module that records (and can slow down) what clients do ----------


class SocketSpy:
    """A stand-in for the ``socket`` module, passed as pymemcache's ``socket_module``.

    Records ``(event, peer_port, time)`` for every connect, send and receive.
    With ``latency`` each reply only becomes readable that long after the
    request was sent, as if every server took that long to answer.
    """

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.events: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)

    def socket(self, *args: Any) -> _SpiedSocket:
        return _SpiedSocket(self, socket.socket(*args))

    def record(self, event: str, port: int) -> None:
        with self._lock:
            self.events.append((event, port, time.monotonic()))

    def count(self, event: str, port: int | None = None) -> int:
        return sum(1 for e, p, _ in self.events if e == event and port in (None, p))


class _SpiedSocket:
    def __init__(self, spy: SocketSpy, sock: socket.socket) -> None:
        self._spy, self._sock, self._port, self._ready_at = spy, sock, 0, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def connect(self, address: Any) -> None:
        self._port = address[1]
        self._spy.record("connect", self._port)
        self._sock.connect(address)

    def sendall(self, data: bytes) -> None:
        self._spy.record("send", self._port)
        self._ready_at = time.monotonic() + self._spy.latency
        self._sock.sendall(data)

    def send(self, data: bytes) -> int:
        self._spy.record("send", self._port)
        self._ready_at = time.monotonic() + self._spy.latency
        return self._sock.send(data)

    def recv(self, size: int) -> bytes:
        delay = self._ready_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._spy.record("recv", self._port)
        return self._sock.recv(size)


# -- fixtures ------------------------------------------------------------------


@pytest.fixture
def one(memcached_1: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_1) as cluster:
        yield cluster


@pytest.fixture
def three(memcached_3: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_3) as cluster:
        yield cluster


@pytest.fixture(params=["one", "three"])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    return request.getfixturevalue(request.param)


def raw_clients(servers: list[MemcachedServer]) -> dict[str, Client]:
    """A plain pymemcache client per server, to look behind the cluster's back."""
    return {s.spec: raw_client(s, serde=pickle_serde) for s in servers}


# -- Store semantics on real memcached ---------------------------------------------


def test_cluster_is_a_store(one: Cluster) -> None:
    assert isinstance(one, Store)


def test_replies_are_real_not_noreply(cluster: Cluster) -> None:
    assert cluster.add("k", 1) is True
    assert cluster.add("k", 2) is False  # noreply would answer True
    assert cluster.delete("k") is True
    assert cluster.delete("k") is False
    assert cluster.touch("k", 10) is False
    assert cluster.set("k", {"a": 1}) is True
    assert cluster.get("k") == {"a": 1}
    assert cluster.get("missing", "dflt") == "dflt"


def test_values_keep_their_type(cluster: Cluster) -> None:
    values = {"s": "text é", "b": b"\x00raw", "i": 42, "f": 1.5, "l": [1, "two"], "n": None}
    assert cluster.set_many(values) == []
    assert cluster.get_many([*values, "absent"]) == values


def test_append_prepend_keep_raw_bytes_and_refuse_missing(cluster: Cluster) -> None:
    assert cluster.append("list", b"+a") is False  # NOT_STORED: no such item
    assert cluster.set("list", b"+a", expire=100)
    assert cluster.append("list", b"+b")
    assert cluster.prepend("list", b"-z")
    assert cluster.get("list") == b"-z+a+b"
    with pytest.raises(TypeError):
        cluster.append("list", "text")  # type: ignore[arg-type]


def test_cas_semantics(cluster: Cluster) -> None:
    assert cluster.gets("c") == (None, None)
    assert cluster.cas("c", 1, 123) is None  # missing key
    cluster.set("c", "v1")
    value, token = cluster.gets("c")
    assert value == "v1"
    assert token is not None
    assert cluster.cas("c", "v2", token) is True
    assert cluster.cas("c", "v3", token) is False  # token changed
    assert cluster.get("c") == "v2"
    assert cluster.gets_many(["c", "absent"]) == {"c": ("v2", cluster.gets("c")[1])}


def test_incr_decr_semantics(cluster: Cluster) -> None:
    assert cluster.incr("n") is None
    cluster.set("n", 10)
    assert cluster.incr("n", 5) == 15
    assert cluster.decr("n", 100) == 0  # decr stops at 0
    cluster.set("n", 2**64 - 1)
    assert cluster.incr("n") == 0  # incr wraps at 2**64
    cluster.set("t", "text")
    with pytest.raises(NonNumericValueError):
        cluster.incr("t")
    with pytest.raises(ValueError, match="delta"):
        cluster.incr("n", -1)


def test_value_over_item_limit_raises(cluster: Cluster) -> None:
    big = b"x" * (1024 * 1024 + 1)
    with pytest.raises(ValueTooLargeError):
        cluster.set("big", big)
    with pytest.raises(ValueTooLargeError):
        cluster.add("big", big)
    # set_many reads every server's reply: the small values are stored.
    assert cluster.set_many({"big": big, **{f"small{i}": i for i in range(10)}}) == ["big"]
    assert cluster.get_many([f"small{i}" for i in range(10)]) == {f"small{i}": i for i in range(10)}
    assert cluster.set("after", 1)
    assert cluster.get("after") == 1
    # appending past the limit is NOT_STORED, like a missing key (store.py)
    cluster.set("grow", b"x" * (1024 * 1000))
    assert cluster.append("grow", b"y" * (1024 * 100)) is False


def test_expire_semantics(cluster: Cluster) -> None:
    cluster.set("gone", 1, expire=-1)
    assert cluster.get("gone") is None
    assert cluster.set_many({"a": 1, "b": 2}, expire=-1) == []
    assert cluster.get_many(["a", "b"]) == {}
    with pytest.raises(ValueError, match="expire"):
        cluster.set_many({"a": 1}, expire="soon")  # type: ignore[arg-type]


def test_multi_key_commands_return_keys_as_given(cluster: Cluster) -> None:
    keys: list[str | bytes] = [f"user:{i}:é" for i in range(30)] + [b"raw:1", b"raw:2"]
    assert cluster.set_many({k: str(k) for k in keys}) == []
    got = cluster.get_many(keys)
    assert got == {k: str(k) for k in keys}
    assert {type(k) for k in got} == {str, bytes}
    cluster.delete_many(keys[:10])
    assert set(cluster.get_many(keys)) == set(keys[10:])
    assert cluster.get_many([]) == {}
    assert cluster.set_many({}) == []
    cluster.delete_many([])


def test_invalid_keys_raise_before_any_io(memcached_1: list[MemcachedServer]) -> None:
    spy = SocketSpy()
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(client_options={"socket_module": spy}))
    for bad in ["", "with space", "x" * 251, "new\nline", 42]:
        with pytest.raises(InvalidKeyError):
            cluster.get(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        cluster.get_many(["fine", "not fine"])
    with pytest.raises(InvalidKeyError):
        cluster.set_many({"fine": 1, "": 2})
    assert spy.events == []
    assert cluster.health()[memcached_1[0].spec].state == "up"


def test_flush_all_and_stats(three: Cluster, memcached_3: list[MemcachedServer]) -> None:
    before = three.stats()
    three.set_many({f"k{i}": i for i in range(30)})
    stats = three.stats()
    assert set(stats) == {s.spec for s in memcached_3}
    assert all(isinstance(s["pid"], int) and isinstance(s["version"], str) for s in stats.values())
    stored = sum(stats[n]["total_items"] - before[n]["total_items"] for n in stats)
    assert stored == 30
    assert three.flush_all() is True
    assert three.get_many([f"k{i}" for i in range(30)]) == {}


def test_unix_socket_server() -> None:
    binary = require_binary("memcached")
    path = os.path.join(tempfile.mkdtemp(), "mc.sock")
    cmd = [binary, "-s", path, "-m", "16"] + (["-u", "root"] if os.geteuid() == 0 else [])
    process = subprocess.Popen(cmd)
    try:
        _wait_listening(path)
        cluster = Cluster([f"unix:{path}"])
        assert cluster.set("k", "v")
        assert cluster.get("k") == "v"
        assert cluster.get_many(["k", "x"]) == {"k": "v"}
        assert list(cluster.health()) == [path]
        cluster.close()
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _wait_listening(path: str) -> None:
    """Until memcached accepts on ``path`` (the file exists from bind(), before listen())."""
    deadline = time.monotonic() + PATIENCE
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
                return
            except OSError:  # not there yet, or not listening yet
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.01)


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        Cluster([])
    with pytest.raises(ConfigurationError):
        Cluster(["127.0.0.1:1", Server("127.0.0.1", 1)])
    # twemproxy names only mean something to the twemproxy variants
    with pytest.raises(ConfigurationError):
        Cluster(["127.0.0.1:1:1 cache1"])
    assert Cluster("127.0.0.1:1;127.0.0.1:2").ring.nodes == ("127.0.0.1:1", "127.0.0.1:2")


# -- routing ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["libmemcached", "libketama", "twemproxy", "spymemcached"])
def test_each_key_lives_on_the_server_the_continuum_names(
    memcached_3: list[MemcachedServer], variant: str
) -> None:
    flush(memcached_3)
    specs = [f"{s.spec}:{w}" for s, w in zip(memcached_3, (1, 2, 3), strict=True)]
    cluster = Cluster(specs, ClusterOptions(ketama=variant))
    ring = Continuum([s.spec for s in memcached_3], weights=[1, 2, 3], variant=variant)
    keys = [f"route:{i}:ü" for i in range(300)]
    cluster.set_many({k: k for k in keys[:150]})
    for key in keys[150:]:
        cluster.set(key, key)
    raw = raw_clients(memcached_3)
    placed = {
        spec: set(client.get_many([k.encode() for k in keys])) for spec, client in raw.items()
    }
    for key in keys:
        owner = ring.get_node(key)
        assert {spec for spec, found in placed.items() if key.encode() in found} == {owner}
    assert all(placed.values()), "every server should own some of 300 keys"


def test_twemproxy_names_route_like_twemproxy(memcached_3: list[MemcachedServer]) -> None:
    flush(memcached_3)
    names = ["alpha", "beta", "gamma"]
    cluster = Cluster(
        [f"{s.spec}:1 {n}" for s, n in zip(memcached_3, names, strict=True)],
        ClusterOptions(ketama="twemproxy"),
    )
    ring = Continuum([s.spec for s in memcached_3], variant="twemproxy", names=names)
    raw = raw_clients(memcached_3)
    for i in range(60):
        cluster.set(f"n{i}", i)
        assert raw[ring.get_node(f"n{i}")].get(f"n{i}") == i


def test_a_routed_key_never_takes_the_remembered_server_of_its_plain_twin(
    memcached_3: list[MemcachedServer],
) -> None:
    """Servers are remembered per key for speed; equal bytes with a route still go by the route."""
    flush(memcached_3)
    cluster = Cluster([s.spec for s in memcached_3])
    raw = raw_clients(memcached_3)
    key = next(
        f"twin:{i}"
        for i in range(100)
        if cluster.ring.get_node(f"twin:{i}") != (cluster.ring.get_node(b"twin-route"))
    )
    for _ in range(2):  # the second round meets the remembered servers
        cluster.set(key, "plain")
        cluster.set(Routed(key.encode(), b"twin-route"), "routed")
        assert raw[cluster.ring.get_node(key)].get(key) == "plain"
        assert raw[cluster.ring.get_node(b"twin-route")].get(key) == "routed"
        assert cluster.get(key) == "plain"
        assert cluster.get(Routed(key.encode(), b"twin-route")) == "routed"


# -- pipelined fan-out -------------------------------------------------------------


def test_every_request_is_sent_before_any_reply_is_read(
    memcached_3: list[MemcachedServer],
) -> None:
    flush(memcached_3)
    spy = SocketSpy()
    cluster = Cluster(
        [s.spec for s in memcached_3], ClusterOptions(client_options={"socket_module": spy})
    )
    keys = [f"fan:{i}" for i in range(60)]
    for operation in (
        lambda: cluster.set_many(dict.fromkeys(keys, 1)),
        lambda: cluster.get_many(keys),
        lambda: cluster.gets_many(keys),
        lambda: cluster.delete_many(keys),
    ):
        spy.events.clear()
        operation()
        kinds = [event for event, _, _ in spy.events if event in ("send", "recv")]
        first_recv = kinds.index("recv")
        assert kinds[:first_recv] == ["send"] * 3, kinds  # one request per server...
        assert "send" not in kinds[first_recv:]  # ...all written before any reply is read


def test_servers_answer_in_parallel(memcached_4_fresh: list[MemcachedServer]) -> None:
    """Four servers cost one wait, not four (HashClient's): every request is written before
    any reply is read, where HashClient reads each reply before writing the next request."""
    specs = [s.spec for s in memcached_4_fresh]
    keys = [f"slow:{i}" for i in range(100)]
    ours, theirs = SocketSpy(), SocketSpy()
    cluster = Cluster(specs, ClusterOptions(client_options={"socket_module": ours}))
    hash_client = HashClient(
        specs, use_pooling=True, default_noreply=False, serde=pickle_serde, socket_module=theirs
    )
    cluster.set_many(dict.fromkeys(keys, 1))
    hash_client.get_many(keys)  # connected, as ours is

    def order(spy: SocketSpy, operation: Any) -> list[str]:
        spy.events.clear()
        operation()
        return [event for event, _, _ in spy.events if event in ("send", "recv")]

    for operation in (
        lambda: cluster.get_many(keys),
        lambda: cluster.set_many(dict.fromkeys(keys, 2)),
    ):
        kinds = order(ours, operation)
        first_recv = kinds.index("recv")
        assert kinds[:first_recv] == ["send"] * 4, kinds  # one request per server...
        assert "send" not in kinds[first_recv:]  # ...all written before any reply is read
    kinds = order(theirs, lambda: hash_client.get_many(keys))
    assert kinds.index("send", kinds.index("recv")) > 0  # a request written after a reply read


def test_single_server_batches_use_one_request(memcached_1: list[MemcachedServer]) -> None:
    flush(memcached_1)
    spy = SocketSpy()
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(client_options={"socket_module": spy}))
    cluster.get("warm")
    spy.events.clear()
    keys = [f"one:{i}" for i in range(50)]
    assert cluster.set_many(dict.fromkeys(keys, 0)) == []
    assert len(cluster.get_many(keys)) == 50
    assert spy.count("send") == 2
    assert spy.count("connect") == 0


# -- threads, pools, close(), sharing ---------------------------------------------------


def test_threads_share_one_cluster(three: Cluster) -> None:
    errors: list[BaseException] = []
    wrong: list[str] = []

    def work(n: int) -> None:
        try:
            for i in range(150):
                key = f"t{n}:{i % 20}"
                three.set(key, (n, i))
                if three.get(key) != (n, i):
                    wrong.append(key)
                batch = {f"t{n}:b{j}": (n, i, j) for j in range(10)}
                assert three.set_many(batch) == []
                if three.get_many(list(batch)) != batch:
                    wrong.append(f"batch {n}:{i}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert wrong == []
    # pooled: never more connections per server than threads
    assert all(len(node.pool.free) <= 6 for node in three._nodes.values())
    assert all(snapshot.state == "up" for snapshot in three.health().values())


def test_close_drops_idle_connections_and_keeps_health(memcached_1: list[MemcachedServer]) -> None:
    spy = SocketSpy()
    dead = f"127.0.0.1:{_closed_port()}"
    cluster = Cluster(
        [memcached_1[0].spec, dead], ClusterOptions(client_options={"socket_module": spy})
    )
    cluster.flush_all()  # connects to the live one, fails on the dead one
    assert cluster.health()[dead].failures == 1
    connects = spy.count("connect", memcached_1[0].port)
    cluster.close()
    assert cluster.health()[dead].failures == 1  # health survives close()
    assert cluster.health()[dead].state == "failing"
    cluster.stats()
    assert spy.count("connect", memcached_1[0].port) == connects + 1  # reconnected after close()


def test_close_leaves_busy_connections_to_their_threads(memcached_1: list[MemcachedServer]) -> None:
    # Django calls close() after each request in its thread while other threads
    # are mid-request on the same shared cluster.
    cluster = Cluster([memcached_1[0].spec])
    stop = threading.Event()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while not stop.is_set():
                cluster.set_many({f"busy:{i}": i for i in range(20)})
                cluster.get_many([f"busy:{i}" for i in range(20)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(200):
        cluster.close()
        time.sleep(0.001)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    assert cluster.health()[memcached_1[0].spec].state == "up"


def test_shared_cluster_is_one_per_configuration(memcached_1: list[MemcachedServer]) -> None:
    reset_shared_clusters()
    spec = memcached_1[0].spec
    first = shared_cluster([spec])
    assert shared_cluster([spec], ClusterOptions()) is first
    assert shared_cluster([Server("127.0.0.1", memcached_1[0].port)]) is first
    assert shared_cluster([spec], ClusterOptions(failover="remap")) is not first
    seen: list[Cluster] = []
    threads = [
        threading.Thread(target=lambda: seen.append(shared_cluster([spec]))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(cluster is first for cluster in seen)
    reset_shared_clusters()
    assert shared_cluster([spec]) is not first
    reset_shared_clusters()


def test_listeners_of_every_caller_are_told_once(memcached_1: list[MemcachedServer]) -> None:
    # A Flask backend may build the shared cluster before a Django one: both hear.
    reset_shared_clusters()
    server = memcached_1[0]
    dead = f"127.0.0.1:{free_port()}"
    options = ClusterOptions(retry_attempts=1)
    flask: list[object] = []
    django: list[object] = []
    first = shared_cluster([server.spec, dead], options, on_value_refused=flask.append)
    for _ in range(2):  # Django builds a backend per thread, with the same hooks
        again = shared_cluster(
            [server.spec, dead],
            options,
            on_node_event=django.append,
            on_value_refused=django.append,
        )
        assert again is first
    keys = {first.ring.get_node(key): key for key in map(str, range(100))}
    assert first.get(keys[dead]) is None
    raw_client(server).set(keys[server.spec], b"{}", flags=FLAG_JSON)  # another serializer's
    assert first.get(keys[server.spec]) is None
    assert [(type(event), getattr(event, "kind", None)) for event in django] == [
        (NodeEvent, "failure"),
        (NodeEvent, "dead"),
        (ValueRefused, None),
    ]
    assert [type(event) for event in flask] == [ValueRefused]
    reset_shared_clusters()


def test_callers_with_other_serdes_get_other_clusters(memcached_1: list[MemcachedServer]) -> None:
    # A shared cluster's serde is the one its options describe, and the options
    # are the registry's key: two serializers cannot silently share one cluster.
    reset_shared_clusters()
    flush(memcached_1)
    spec = memcached_1[0].spec
    pickled = shared_cluster([spec])
    json = shared_cluster(
        [spec], ClusterOptions(serializer="django_mcpatterns.core.serializers.JSONSerializer")
    )
    assert json is not pickled
    json.set("value", {"a": [1]})
    assert json.get("value") == {"a": [1]}
    assert pickled.get("value") is None  # a JSON item, refused by the pickle reader
    with pytest.raises(TypeError):
        shared_cluster([spec], serde=pickle_serde)  # type: ignore[call-arg]
    reset_shared_clusters()


def _closed_port() -> int:
    """A loopback port nobody listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
