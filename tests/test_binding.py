"""The binding both frameworks' backends build on: each convention is a parameter, wired once."""

from __future__ import annotations

from typing import Any

import pytest

from django_mcpatterns.binding import Conventions, Setting, bind_cluster, bind_embedded
from django_mcpatterns.core.chunks import ChunkedStore
from django_mcpatterns.core.cluster import reset_shared_clusters
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.memory import reset_shared_memory_stores
from django_mcpatterns.core.sets import SetOptions


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    yield
    reset_shared_clusters()
    reset_shared_memory_stores()


def test_the_embedded_store_is_shared_by_name_or_the_bindings_own() -> None:
    shared = Conventions(shared=True)
    assert bind_embedded("a", {}, shared).store is bind_embedded("a", {}, shared).store
    assert bind_embedded("a", {}, shared).store is not bind_embedded("b", {}, shared).store
    own = Conventions()
    assert bind_embedded("a", {}, own).store is not bind_embedded("a", {}, own).store


def test_the_stores_and_set_objects_are_made_once_per_store() -> None:
    first, second = (bind_embedded("a", {}, Conventions(shared=True)) for _ in range(2))
    assert first.async_store is first.async_store
    assert first.sets is second.sets
    assert first.async_lists is second.async_lists
    tuned = bind_embedded(
        "a", {}, Conventions(shared=True), set_options=lambda store: SetOptions(max_shards=8)
    )
    assert tuned.sets is not first.sets
    assert tuned.sets.options.max_shards == 8


def test_values_are_chunked_only_when_asked() -> None:
    plain = bind_embedded("", {}, Conventions())
    assert plain.values is plain.store
    assert plain.async_values is plain.async_store
    chunked = bind_embedded("", {"large_values": "chunk", "max_item_size": 2048}, Conventions())
    assert isinstance(chunked.values, ChunkedStore)
    assert chunked.values.max_item_size == 2048


def test_the_secrets_sign_only_when_asked_and_are_read_only_then() -> None:
    read: list[str] = []

    def secrets() -> list[str]:
        read.append("read")
        return ["s" * 50]

    bind_embedded("", {}, Conventions(secrets=secrets))
    assert read == []
    signed = bind_embedded("", {"signed": True}, Conventions(secrets=secrets))
    assert read == ["read"]
    assert signed.store.serde is not None  # made with the derived key
    with pytest.raises(ConfigurationError):
        bind_embedded("", {"signed": True}, Conventions())  # no secrets: no key


def test_the_label_names_instrumented_clusters_only(memcached_1: Any) -> None:
    asked: list[str] = []

    def label() -> str:
        asked.append("asked")
        return "web"

    spec = [memcached_1[0].spec]
    bind_cluster(spec, {}, Conventions(label=label))
    assert asked == []
    named = bind_cluster(spec, {"instrumentation": ["prometheus"]}, Conventions(label=label))
    assert named.store.options.instrumentation_name == "web"
    explicit = {"instrumentation": ["prometheus"], "instrumentation_name": "mine"}
    assert (
        bind_cluster(spec, explicit, Conventions(label=label)).store.options.instrumentation_name
        == "mine"
    )
    assert asked == ["asked"]


def test_the_key_scope_applies_to_replicated_clusters(memcached_1: Any) -> None:
    spec = [memcached_1[0].spec]
    scoped = Conventions(key_scope="app:")
    assert bind_cluster(spec, {}, scoped).store.options.replicate_scope == ""
    replicated = bind_cluster(spec, {"replicate": {"hot:": 1}}, scoped)
    assert replicated.store.options.replicate_scope == "app:"
    given = {"replicate": {"hot:": 1}, "replicate_scope": "x"}
    assert bind_cluster(spec, given, scoped).store.options.replicate_scope == "x"


@pytest.mark.parametrize(
    ("servers", "options", "setting"),
    [
        ("nonsense:port", {}, "servers"),
        ("127.0.0.1:11211", {"ketama": "md5"}, "options"),
    ],
)
def test_errors_say_which_setting_they_are_about(
    servers: str, options: dict[str, Any], setting: Setting
) -> None:
    seen: list[Setting] = []

    def refused(where: Setting, error: ConfigurationError) -> Exception:
        seen.append(where)
        return RuntimeError(str(error))

    with pytest.raises(RuntimeError) as raised:
        bind_cluster(servers, options, Conventions(refused=refused))
    assert seen == [setting]
    assert isinstance(raised.value.__cause__, ConfigurationError)
    with pytest.raises(RuntimeError):
        bind_embedded("", {"max_bytes": -1}, Conventions(refused=refused))
    assert seen == [setting, "options"]
