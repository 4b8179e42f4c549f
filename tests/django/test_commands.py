"""mcpatterns_ring and mcpatterns_health, run as a project runs them (call_command)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_mcpatterns.core.ketama import Continuum
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer

pytestmark = pytest.mark.usefixtures("reset_shared_stores")

# The ring needs no server: these addresses are never contacted.
NODES = ["127.0.0.1:21001", "127.0.0.1:21002", "127.0.0.1:21003"]


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def run_json(command: str, *args: str) -> Any:
    return json.loads(run(command, *args, "--json"))


@pytest.fixture
def cluster_cache() -> Iterator[None]:
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": NODES, "OPTIONS": {"ketama": "libmemcached"}}
    with override_settings(CACHES={"default": entry}):
        yield


def sampled_moves(before: Continuum, after: Continuum, keys: int = 20_000) -> float:
    """The fraction of sample keys whose server changes: the slow, approximate way."""
    sample = [f"user:{i}:profile" for i in range(keys)]
    return sum(before.get_node(k) != after.get_node(k) for k in sample) / keys


# -- mcpatterns_ring ---------------------------------------------------------------


@pytest.mark.usefixtures("cluster_cache")
def test_ring_shows_each_servers_share_of_the_keyspace():
    report = run_json("mcpatterns_ring")
    ring = Continuum(NODES)
    assert report["variant"] == "libmemcached"
    assert [s["node"] for s in report["servers"]] == NODES
    assert {s["node"]: s["share"] for s in report["servers"]} == ring.shares()
    assert [s["points"] for s in report["servers"]] == [160, 160, 160]
    assert sum(s["share"] for s in report["servers"]) == pytest.approx(1)
    text = run("mcpatterns_ring")
    assert text.startswith("Cache 'default': ketama 'libmemcached', 3 servers\n")
    for node, share in ring.shares().items():
        assert f"{share * 100:.2f}%" in text.split(node)[1].splitlines()[0]


@pytest.mark.usefixtures("cluster_cache")
def test_adding_a_server_moves_exactly_its_arcs():
    change = run_json("mcpatterns_ring", "--add", "127.0.0.1:21004")["change"]
    after = Continuum([*NODES, "127.0.0.1:21004"])
    # Equal weights: every moved key goes to the new server, and only those move.
    assert change["moved"] == pytest.approx(after.shares()["127.0.0.1:21004"], abs=1e-12)
    assert {f["to"] for f in change["flows"]} == {"127.0.0.1:21004"}
    assert change["ideal_moved"] == pytest.approx(0.25)
    assert change["moved"] == pytest.approx(sampled_moves(Continuum(NODES), after), abs=0.01)


@pytest.mark.usefixtures("cluster_cache")
def test_removing_a_server_moves_its_share_to_the_others():
    change = run_json("mcpatterns_ring", "--remove", NODES[1])["change"]
    assert change["moved"] == pytest.approx(Continuum(NODES).shares()[NODES[1]], abs=1e-12)
    assert {f["from"] for f in change["flows"]} == {NODES[1]}
    assert [s["node"] for s in change["servers"]] == [NODES[0], NODES[2]]
    text = run("mcpatterns_ring", "--remove", NODES[1])
    assert f"After removing {NODES[1]}:" in text
    assert "Keys moved: " in text


def test_weights_change_every_servers_points_and_the_movement_shows_it():
    nodes = ["127.0.0.1:21001:1", "127.0.0.1:21002:2", "127.0.0.1:21003:3"]
    with override_settings(CACHES={"default": {"BACKEND": CLUSTER_BACKEND, "LOCATION": nodes}}):
        report = run_json("mcpatterns_ring", "--add", "127.0.0.1:21004:2")
    before = Continuum(NODES, weights=[1, 2, 3])
    after = Continuum([*NODES, "127.0.0.1:21004"], weights=[1, 2, 3, 2])
    change = report["change"]
    assert [s["ideal"] for s in report["servers"]] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    # The float weight formula recounts everyone's points: some keys move
    # between old servers too, which sampling confirms.
    assert change["moved"] == pytest.approx(sampled_moves(before, after), abs=0.01)
    assert change["moved"] >= after.shares()["127.0.0.1:21004"]


@pytest.mark.usefixtures("cluster_cache")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--remove", "127.0.0.1:29999"], "not a server of this cache"),
        (["--add", NODES[0]], "already a server of this cache"),
        (["--add", "127.0.0.1:port"], "invalid port"),
        (
            ["--remove", NODES[0], "--remove", NODES[1], "--remove", NODES[2]],
            "no memcached servers",
        ),
        (["--cache", "nope"], "no cache 'nope' in CACHES"),
    ],
)
def test_ring_refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        run("mcpatterns_ring", *args)


def test_ring_of_the_embedded_store_is_a_command_error():
    with (
        override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}}),
        pytest.raises(CommandError, match="embedded in-process store: it has no ring"),
    ):
        run("mcpatterns_ring")


def test_commands_refuse_caches_of_other_backends():
    other = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with (
        override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}, "other": other}),
        pytest.raises(CommandError, match="does not use a django-mcpatterns backend"),
    ):
        run("mcpatterns_health", "--cache", "other")


def test_commands_have_one_line_help():
    from django_mcpatterns.management.commands import mcpatterns_health, mcpatterns_ring

    for module in (mcpatterns_ring, mcpatterns_health):
        assert "\n" not in module.Command.help
        assert module.Command.help.endswith(".")


# -- mcpatterns_health ------------------------------------------------------------


def test_health_reports_memcached_counters(memcached_3: list[MemcachedServer]):
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [s.spec for s in memcached_3]}
    with override_settings(CACHES={"default": entry}):
        before = run_json("mcpatterns_health")
        cache = caches["default"]
        cache.set_many({f"health:{i}": i for i in range(30)})
        cache.get_many([f"health:{i}" for i in range(40)])  # 30 hits, 10 misses
        after = run_json("mcpatterns_health")
        text = run("mcpatterns_health")
    assert [s["node"] for s in after["servers"]] == [s.spec for s in memcached_3]
    assert {s["state"] for s in after["servers"]} == {"up"}

    def total(report: Any, name: str) -> int:
        return sum(s["stats"][name] for s in report["servers"])

    assert total(after, "hits") - total(before, "hits") == 30
    assert total(after, "misses") - total(before, "misses") == 10
    assert total(after, "items") >= 30
    assert all(s["stats"]["version"] and s["stats"]["bytes"] >= 0 for s in after["servers"])
    header = text.splitlines()[1].split()
    assert header[:4] == ["server", "state", "failures", "hits"]
    assert "evictions" in header
    assert "items" in header
    assert "bytes" in header


def test_health_shows_a_dead_server(memcached_4_fresh: list[MemcachedServer]):
    specs = [s.spec for s in memcached_4_fresh]
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs, "OPTIONS": {"retry_attempts": 1}}
    memcached_4_fresh[2].kill()
    with override_settings(CACHES={"default": entry}):
        report = run_json("mcpatterns_health")  # asking for stats finds it down
        text = run("mcpatterns_health")
    states = {s["node"]: (s["state"], s["stats"]) for s in report["servers"]}
    state, stats = states[specs[2]]
    assert state == "dead"
    assert stats is None
    assert all(states[n][0] == "up" and states[n][1] for n in specs if n != specs[2])
    assert f"{specs[2]}: last error: ConnectionRefusedError" in text
    assert "dead, no stats" in text


def test_health_on_the_embedded_store():
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "hc"}}):
        cache = caches["default"]
        cache.set_many({"a": 1, "b": 2})
        before = run_json("mcpatterns_health")["servers"][0]["stats"]
        cache.get_many(["a", "b", "c"])
        cache.get("d")
        report = run_json("mcpatterns_health")
        text = run("mcpatterns_health")
    (server,) = report["servers"]
    assert server["node"] == "in-process"
    assert server["state"] == "embedded"
    assert server["stats"]["items"] == 2
    assert server["stats"]["bytes"] > 0
    # The in-process store counts reads per key, as memcached does.
    assert server["stats"]["hits"] - before["hits"] == 2
    assert server["stats"]["misses"] - before["misses"] == 2
    assert server["hit_ratio"] is not None
    assert report["variant"] is None
    assert report["ring"] == []
    row = text.splitlines()[2].split()
    assert row[:2] == ["in-process", "embedded"]
    assert row[5].endswith("%")  # the hit ratio
