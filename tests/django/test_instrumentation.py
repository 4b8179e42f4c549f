"""Instrumentation through the Django backend: pattern spans around their command spans
(sync and async), events in metrics and on spans, the alias as the cache label, checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from prometheus_client import CollectorRegistry

from django_mcpatterns.checks import check_caches
from django_mcpatterns.core.observe import Observer
from django_mcpatterns.patterns.observed import observe_patterns, observer_of
from tests.core.test_observe import commands, sample, samples
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer
from tests.observing import spans_exporter

pytestmark = pytest.mark.usefixtures("reset_shared_stores")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def instrumented(memcached_3: list[MemcachedServer], registry: CollectorRegistry) -> Iterator[Any]:
    for server in memcached_3:
        server.flush()
    options = {
        "instrumentation": ["prometheus", "opentelemetry"],
        "prometheus_registry": registry,
    }
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [s.spec for s in memcached_3]}
    with override_settings(CACHES={"sessions": {**entry, "OPTIONS": options}}):
        yield caches["sessions"]


def test_a_pattern_call_span_is_the_parent_of_its_command_spans(instrumented: Any) -> None:
    with spans_exporter() as exporter:
        assert instrumented.sadd("tags", "red", "green") == 2
    spans = exporter.get_finished_spans()
    (call,) = [span for span in spans if span.name == "cache.sadd"]
    children = [span for span in spans if span.parent is not None]
    assert [span.name for span in children] == ["append", "add"]  # missing, then created
    assert all(span.parent.span_id == call.context.span_id for span in children)  # type: ignore[union-attr]
    assert call.kind.name == "INTERNAL"
    assert dict(call.attributes or {})["mcpatterns.cache"] == "sessions"  # the alias


def test_events_are_counted_and_put_on_the_pattern_span(
    instrumented: Any, registry: CollectorRegistry
) -> None:
    with spans_exporter() as exporter:
        assert instrumented.get_or_compute("answer", lambda: 42, timeout=60) == 42
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "cache.get_or_compute"]
    assert [event.name for event in call.events] == ["recomputed"]
    found = samples(registry)
    assert sample(found, "mcpatterns_events_total", cache="sessions", event="recomputed") == 1
    assert commands(found, cache="sessions", command="mg", outcome="miss") == 1


def test_a_failing_pattern_call_has_an_error_span(instrumented: Any) -> None:
    def broken() -> int:
        raise RuntimeError("source of truth is down")

    with spans_exporter() as exporter, pytest.raises(RuntimeError):
        instrumented.get_or_compute("broken", broken, timeout=60)
    (call,) = [s for s in exporter.get_finished_spans() if s.name == "cache.get_or_compute"]
    assert call.status.status_code.name == "ERROR"


class _Host:
    """A minimal pattern host with one coroutine method: the async wrapper's own test."""

    def __init__(self, store: Any) -> None:
        self.store = store


class _AsyncMixin:
    async def aread(self, key: str) -> Any:
        await asyncio.sleep(0)
        return self.store.get(key)  # type: ignore[attr-defined]

    async def aread_twice(self, key: str) -> tuple[Any, Any]:
        # A pattern calling another: one call, one span.
        return await self.aread(key), await self.aread(key)


def test_async_pattern_calls_are_spans_around_their_commands(instrumented: Any) -> None:
    host_class = observe_patterns(_AsyncMixin)(type("Host", (_AsyncMixin, _Host), {}))
    host = host_class(instrumented.store)
    instrumented.set("k", "v")
    key = instrumented.make_key("k")

    async def two_tasks_then_a_nested_call() -> Any:
        # Two tasks at once: each one's command belongs to its own call.
        both = await asyncio.gather(host.aread(key), host.aread(key))
        return both, await host.aread_twice(key)

    with spans_exporter() as exporter:
        assert asyncio.run(two_tasks_then_a_nested_call()) == (["v", "v"], ("v", "v"))
    spans = exporter.get_finished_spans()
    calls = {s.context.span_id: s.name for s in spans if s.name.startswith("cache.")}
    assert sorted(calls.values()) == ["cache.aread", "cache.aread", "cache.aread_twice"]
    parents = [calls[s.parent.span_id] for s in spans if s.name == "get"]  # type: ignore[union-attr]
    assert sorted(parents) == [
        "cache.aread",
        "cache.aread",
        "cache.aread_twice",
        "cache.aread_twice",
    ]
    by_task = [s.parent.span_id for s in spans if s.name == "get"][:2]  # type: ignore[union-attr]
    assert len(set(by_task)) == 2  # not both under one task's call


def test_off_by_default_pattern_calls_ask_one_attribute(memcached_1: list[MemcachedServer]) -> None:
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [memcached_1[0].spec]}
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        assert observer_of(cache) is None
        with spans_exporter() as exporter:
            cache.sadd("quiet", 1)
        assert exporter.get_finished_spans() == ()


def test_an_explicit_name_wins_over_the_alias(memcached_1: list[MemcachedServer]) -> None:
    options = {"instrumentation": ["opentelemetry"], "instrumentation_name": "web"}
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": [memcached_1[0].spec], "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        observer = observer_of(caches["default"])
        assert isinstance(observer, Observer)
        assert observer.cache == "web"


def test_a_missing_package_is_a_system_check_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": "127.0.0.1:11211",
        "OPTIONS": {"instrumentation": ["opentelemetry"]},
    }
    with override_settings(CACHES={"default": entry}):
        (error,) = check_caches()
    assert error.id == "mcpatterns.E006"
    assert "django-mcpatterns[opentelemetry]" in error.msg
    assert "django-mcpatterns[opentelemetry]" in error.hint


def test_a_namespace_call_is_one_span_around_its_commands(instrumented: Any) -> None:
    ns = instrumented.namespace("user", 42)
    with spans_exporter() as exporter:
        assert ns.get_or_compute("profile", lambda: {"name": "Ada"}, timeout=60) == {"name": "Ada"}
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name.startswith("cache.")]
    assert [s.name for s in calls] == ["cache.namespace.get_or_compute"]
    commands = [s for s in spans if not s.name.startswith("cache.")]
    assert commands  # the version read, the claim, the fill...
    assert {s.parent.span_id for s in commands} == {calls[0].context.span_id}  # type: ignore[union-attr]


def test_async_pattern_methods_of_the_backend_are_spans_too(instrumented: Any) -> None:
    async def work() -> Any:
        value = await instrumented.aget_or_compute("async-answer", lambda: 42, timeout=60)
        await instrumented.astore.close()
        return value

    with spans_exporter() as exporter:
        assert asyncio.run(work()) == 42
    spans = exporter.get_finished_spans()
    (call,) = [s for s in spans if s.name.startswith("cache.")]
    assert call.name == "cache.aget_or_compute"
    commands = [s for s in spans if not s.name.startswith("cache.")]
    assert commands
    assert {s.parent.span_id for s in commands} == {call.context.span_id}  # type: ignore[union-attr]
    assert [event.name for event in call.events] == ["recomputed"]


def test_the_embedded_backend_takes_the_options_and_measures_nothing() -> None:
    options = {"instrumentation": ["prometheus"], "trace_keys": True, "max_bytes": 2**22}
    entry = {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "instrumented", "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
        assert cache.sadd("dev", 1) == 1  # no wire: nothing to measure, nothing refused
        assert observer_of(cache) is None
    entry["OPTIONS"] = {"instrumentation": ["statsd"]}
    with override_settings(CACHES={"default": entry}), pytest.raises(ImproperlyConfigured):
        caches["default"].get("x")


def test_caches_sharing_one_options_dict_are_labelled_with_their_own_alias(
    memcached_3: list[MemcachedServer], registry: CollectorRegistry
) -> None:
    """Settings often share one OPTIONS dict between caches: each is still its own alias."""
    for server in memcached_3:
        server.flush()
    options = {"instrumentation": ["prometheus"], "prometheus_registry": registry}
    caches_setting = {
        "default": {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": memcached_3[0].spec,
            "OPTIONS": options,
        },
        "sessions": {
            "BACKEND": CLUSTER_BACKEND,
            "LOCATION": memcached_3[1].spec,
            "OPTIONS": options,
        },
    }
    with override_settings(CACHES=caches_setting):
        caches["default"].set("a", 1)
        caches["sessions"].set("b", 1)
        caches["sessions"].set("c", 1)
    found = samples(registry)
    assert commands(found, cache="default", server=memcached_3[0].spec) == 1
    assert commands(found, cache="sessions", server=memcached_3[1].spec) == 2


def test_a_locks_acquire_and_release_are_pattern_calls_around_their_commands(
    instrumented: Any,
) -> None:
    """cache.lock(...) is a pattern: taking and releasing it are spans around their commands,
    sync and async (with the lock's key, like every pattern call's, for the toolbar)."""
    with spans_exporter() as exporter:
        with instrumented.lock("job"):
            pass

        async def run() -> None:
            async with instrumented.lock("ajob"):
                pass
            await instrumented.astore.close()

        asyncio.run(run())
    spans = exporter.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    for name in ("acquire", "release", "aacquire", "arelease"):
        (call,) = [span for span in spans if span.name == f"cache.lock.{name}"]
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == call.context.span_id
        ]
        assert children, name  # its round trips are its children
        assert all(child.kind.name == "CLIENT" for child in children)
    commands_of_calls = [s for s in spans if s.kind.name == "CLIENT"]
    assert all(s.parent is not None and s.parent.span_id in by_id for s in commands_of_calls)
