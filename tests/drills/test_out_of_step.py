"""Replies that do not answer the request: a protocol error, never a wrong value.

Each test puts a pooled connection out of step the way a shared socket does:
a request is sent on it behind the cluster's back and its reply (memcached's
own) is left unread, so the cluster's next command on that connection reads
an answer to something else.  That is a :class:`ProtocolError`: the
connection is closed and the operation fails as on a server failure (a miss
or a failed write; the error itself with ``raise_errors``), and the next
command, on a new connection, is answered correctly.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError, ProtocolError
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import MemcachedServer

MINE, OTHER = "step:mine", "step:other"


@pytest.fixture
def cluster(memcached_1: list[MemcachedServer]) -> Iterator[Cluster]:
    (server,) = memcached_1
    server.flush()
    # retry_timeout=0: the failure a mismatch counts does not keep the next command away.
    cluster = Cluster([server.spec], ClusterOptions(retry_timeout=0.0))
    cluster.set(MINE, "my value")
    cluster.set(OTHER, "other value")
    try:
        yield cluster
    finally:
        cluster.close()


def out_of_step(cluster: Cluster, stray: bytes) -> None:
    """Leave memcached's reply to ``stray`` unread on the pooled connection."""
    (node,) = cluster._nodes.values()
    client = node.pool.get()
    client.connect()
    client.sock.sendall(stray)
    readable, _, _ = select.select([client.sock], [], [], 5)
    assert readable, "memcached did not answer the stray request"
    node.pool.release(client)


def test_get_never_returns_the_value_of_a_key_it_did_not_ask_for(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")
    assert cluster.get(MINE) is None  # a miss, not "other value", not KeyError
    assert cluster.get(MINE) == "my value"  # a new connection, in step


def test_get_raises_protocol_error_with_raise_errors(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")
    with pytest.raises(ProtocolError) as raised:
        cluster.strict().get(MINE)
    assert isinstance(raised.value, NodeUnavailableError)  # what strict callers catch
    assert cluster.strict().get(MINE) == "my value"


def test_get_many_never_returns_an_unrequested_key(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")
    assert cluster.get_many([MINE, "step:absent"]) == {}  # a miss, not KeyError
    assert cluster.get_many([MINE, OTHER]) == {MINE: "my value", OTHER: "other value"}


def test_gets_many_never_returns_an_unrequested_key(cluster: Cluster) -> None:
    out_of_step(cluster, b"gets step:other\r\n")
    with pytest.raises(ProtocolError):
        cluster.strict().gets_many([MINE])
    assert list(cluster.gets_many([MINE])) == [MINE]


def test_set_many_out_of_step_fails_its_keys_without_raising(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")
    assert cluster.set_many({MINE: "new value"}) == [MINE]
    # memcached did store it: the outcome was unknown.  The write came on the connection the
    # client then closed, the next one on a new connection, which another memcached thread
    # may serve first: wait for the first to land (a 5 s hang guard).
    for _ in range(100):
        if cluster.get(MINE) == "new value":
            break
        time.sleep(0.05)
    assert cluster.set_many({MINE: "newer value"}) == []
    assert cluster.get(MINE) == "newer value"


def test_delete_many_out_of_step_is_a_protocol_error(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")
    with pytest.raises(ProtocolError):
        cluster.strict().delete_many([MINE])


def test_incr_reading_another_commands_reply_is_a_failure_not_value_error(
    cluster: Cluster,
) -> None:
    cluster.set("step:count", 1)
    out_of_step(cluster, b"set step:stray 0 0 1\r\nx\r\n")  # leaves "STORED" unread
    assert cluster.incr("step:count") is None  # failed, not ValueError
    out_of_step(cluster, b"set step:stray 0 0 1\r\nx\r\n")
    with pytest.raises(ProtocolError):
        cluster.strict().incr("step:count")


def test_delete_reading_another_commands_reply_is_a_protocol_error(cluster: Cluster) -> None:
    out_of_step(cluster, b"set step:stray 0 0 1\r\nx\r\n")  # "STORED" is no answer to delete
    with pytest.raises(ProtocolError):
        cluster.strict().delete(OTHER)
    assert cluster.get(MINE) == "my value"  # the next command is in step


def test_a_stray_line_for_a_store_is_a_failed_write(cluster: Cluster) -> None:
    out_of_step(cluster, b"get step:other\r\n")  # "VALUE ..." is no answer to set
    assert cluster.set(MINE, "new value") is False  # not ServerError
    # memcached did store it: the outcome was unknown.  The set came on the connection the
    # client then closed, the read on a new one, which another memcached thread may serve
    # first: wait for the set to land (a 5 s hang guard).
    for _ in range(100):
        if cluster.get(MINE) == "new value":
            break
        time.sleep(0.05)
    assert cluster.get(MINE) == "new value"
