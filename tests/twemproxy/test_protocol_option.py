"""``OPTIONS["protocol"]``: a text-only server in meta mode gets one clear error.

twemproxy (a real nutcracker here) closes the connection on a meta command;
memcached before 1.6 answers it ``ERROR`` (Debian 12 ships no such memcached:
a loopback stand-in that answers ``ERROR`` to every meta command plays it).
Either way the first meta use raises :class:`CommandNotSupportedError` naming
the option, and the server stays healthy: nothing is poisoned, nothing misses.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from django.core.cache import caches
from django.test import override_settings

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import CommandNotSupportedError, ConfigurationError
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.wire import MetaGet
from tests.harness import LOOPBACK, Nutcracker

BACKEND = "django_mcpatterns.backend.KetamaMemcacheCache"


def meta_refused(spec: str, how: str) -> str:
    """The error a user sees when ``spec`` refuses ``mg`` (``how``: what it did)."""
    return (
        f"memcached at {spec} does not speak the meta protocol (it {how} mg); "
        "set OPTIONS['protocol'] = 'text' for twemproxy, mcrouter or memcached before 1.6"
    )


def test_options_default_to_meta_and_refuse_other_protocols() -> None:
    assert ClusterOptions().protocol == "meta"
    assert ClusterOptions.from_mapping({"protocol": "text"}).protocol == "text"
    with pytest.raises(ConfigurationError) as raised:
        ClusterOptions(protocol="binary")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "invalid value 'binary' for option 'protocol'; valid choices: 'meta', 'text'"
    )
    assert raised.value.option == "protocol"


def test_meta_through_twemproxy_raises_one_error_naming_the_option(
    nutcracker: Nutcracker,
) -> None:
    nutcracker.flush()
    cluster = Cluster([nutcracker.spec], options=ClusterOptions(raise_errors=True))
    try:
        assert cluster.set("k", 1)
        with pytest.raises(CommandNotSupportedError) as raised:
            cluster.ttl("k")
        assert str(raised.value) == meta_refused(nutcracker.spec, "closed the connection on")
        assert (raised.value.option, raised.value.command) == ("protocol", "mg")
        with pytest.raises(CommandNotSupportedError, match="does not speak the meta protocol"):
            cluster.exchange("k", [MetaGet(b"k", value=True)])
        # Not a server failure: the proxy stays healthy and the next command works.
        assert cluster.health()[nutcracker.spec].failures == 0
        assert cluster.get("k") == 1
    finally:
        cluster.close()


def test_a_django_set_read_through_twemproxy_in_meta_mode_is_not_a_silent_miss(
    nutcracker: Nutcracker,
) -> None:
    nutcracker.flush()
    setting = {"BACKEND": BACKEND, "LOCATION": nutcracker.spec}  # protocol left at "meta"
    with override_settings(CACHES={"default": setting}):
        cache = caches["default"]
        cache.sadd("s", *range(1000))
        cache.srem("s", *range(950))  # a dirty log: the next read rewrites the set
        with pytest.raises(CommandNotSupportedError, match=r"OPTIONS\['protocol'\] = 'text'"):
            cache.smembers("s")
        assert cache.get_or_set("k", 1) == 1


def test_flush_and_stats_through_twemproxy(nutcracker: Nutcracker) -> None:
    cluster = Cluster([nutcracker.spec], options=ClusterOptions(protocol="text"))
    try:
        with pytest.raises(CommandNotSupportedError) as raised:
            cluster.flush_all()
        assert str(raised.value) == (
            f"memcached at {nutcracker.spec} does not support flush_all (it closed the "
            "connection on flush_all): a proxy such as twemproxy passes neither flush_all "
            "nor stats; send them to the servers behind it"
        )
        assert cluster.stats() == {}  # the status page shows no stats, and does not fail
        assert cluster.health()[nutcracker.spec].failures == 0
    finally:
        cluster.close()


@pytest.fixture
def old_memcached() -> Iterator[str]:
    """A stand-in for memcached 1.5 on loopback: text ``get``/``set``, ``ERROR`` to meta."""
    listener = socket.create_server((LOOPBACK, 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                verb = line.split(b" ", 1)[0].strip()
                if verb == b"set":
                    lines.readline()  # the data block
                    conn.sendall(b"STORED\r\n")
                elif verb == b"version":
                    conn.sendall(b"VERSION 1.5.22\r\n")
                else:
                    conn.sendall(b"END\r\n" if verb == b"get" else b"ERROR\r\n")

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"{LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join()
        listener.close()


def test_a_server_answering_error_to_meta_raises_the_same_error(old_memcached: str) -> None:
    cluster = Cluster([old_memcached])  # default view: the error is not a degraded miss
    try:
        with pytest.raises(CommandNotSupportedError) as raised:
            cluster.ttl("k")
        assert str(raised.value) == meta_refused(old_memcached, "answered ERROR to")
        with pytest.raises(CommandNotSupportedError, match="answered ERROR to mg"):
            cluster.exchange("k", [MetaGet(b"k", value=True)])
        assert cluster.set("k", 1)
        assert cluster.health()[old_memcached].failures == 0
    finally:
        cluster.close()
