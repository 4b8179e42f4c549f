"""TLS to memcached through pymemcache's ``tls_context`` (``OPTIONS["tls_context"]``).

Against a real memcached started with ``-Z`` and a certificate made for the test:
every command, the pipelined multi-key path included, works over TLS; nothing
readable crosses the wire; a client without TLS, or one that does not trust the
certificate, gets a node failure (a miss, or ``NodeUnavailableError``), never data.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import AppendSets
from tests.drills.proxy import proxied
from tests.drills.tls import Certificate, make_certificate
from tests.harness import MemcachedServer

SECRET = b"card=4111-1111-1111-1111"


def tls_cluster(spec: str, context: ssl.SSLContext, **options: object) -> Cluster:
    parsed = ClusterOptions.from_mapping({"tls_context": context, "timeout": 2, **options})
    assert parsed.client_options["tls_context"] is context  # passed through, as Django does
    return Cluster([spec], parsed)


def test_every_command_works_over_tls(
    tls_server: MemcachedServer, certificate: Certificate
) -> None:
    cluster = tls_cluster(tls_server.spec, certificate.client_context())
    assert cluster.flush_all()
    assert cluster.set("a", {"x": 1})
    assert cluster.get("a") == {"x": 1}
    assert cluster.set_many({f"k{i}": i for i in range(50)}) == []
    assert cluster.get_many([f"k{i}" for i in range(50)]) == {f"k{i}": i for i in range(50)}
    assert cluster.add("fresh", b"raw")
    assert cluster.append("fresh", b"+more")
    assert cluster.get("fresh") == b"raw+more"
    _, token = cluster.gets("a")
    assert cluster.cas("a", {"x": 2}, token)
    assert cluster.incr("k7", 5) == 12
    assert cluster.touch("k1", 60)
    assert cluster.delete("k1")
    cluster.delete_many(["k2", "k3"])
    assert cluster.get_many(["k1", "k2", "k3", "k4"]) == {"k4": 4}
    sets = AppendSets(cluster)
    sets.sadd("members", "a", b"b", 3)
    assert sets.smembers("members") == {"a", b"b", 3}
    with Lock(cluster, "job", 5) as lock:
        assert lock.owned()
    assert cluster.stats()[tls_server.spec]["curr_connections"]
    cluster.close()


def test_nothing_readable_crosses_the_wire(
    tls_server: MemcachedServer, certificate: Certificate
) -> None:
    with proxied(tls_server.port) as proxy:
        cluster = tls_cluster(proxy.spec, certificate.client_context())
        assert cluster.set("secret-key", SECRET)
        assert cluster.get_many(["secret-key"]) == {"secret-key": SECRET}
        cluster.close()
        wire = b"".join(proxy.sent() + proxy.received())
    assert wire  # the proxy saw the traffic...
    assert SECRET not in wire  # ...and could read none of it
    assert b"secret-key" not in wire


def test_a_client_without_tls_gets_a_node_failure_not_data(tls_server: MemcachedServer) -> None:
    plain = Cluster([tls_server.spec], ClusterOptions(timeout=2))
    assert plain.get("a") is None
    assert plain.set("a", 1) is False
    strict = Cluster([tls_server.spec], ClusterOptions(timeout=2, raise_errors=True))
    with pytest.raises(NodeUnavailableError):
        strict.get("a")


def test_a_certificate_the_client_does_not_trust_is_refused(
    tls_server: MemcachedServer, tmp_path: Path
) -> None:
    stranger = make_certificate(tmp_path)  # a different CA than the server's
    cluster = tls_cluster(tls_server.spec, stranger.client_context(), raise_errors=True)
    with pytest.raises(NodeUnavailableError) as info:
        cluster.get("a")
    assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)
