"""Instrumentation through the Flask backend: CACHE_OPTIONS turns it on, pattern calls are spans."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tests.core.test_observe import commands, sample, samples
from tests.flask.conftest import FlaskDeployment
from tests.harness import MemcachedServer
from tests.observing import spans_exporter


@pytest.fixture(autouse=True)
def _fresh_clusters() -> object:
    yield
    from django_mcpatterns.core.cluster import reset_shared_clusters

    reset_shared_clusters()


def test_flask_cache_options_turn_on_metrics_and_spans(memcached_1: list[MemcachedServer]) -> None:
    registry = CollectorRegistry()
    deployment = FlaskDeployment.cluster(
        memcached_1,
        instrumentation=["prometheus", "opentelemetry"],
        instrumentation_name="flask",
        prometheus_registry=registry,
    )
    deployment.flush()
    cache = deployment.make_cache()
    with spans_exporter() as exporter:
        assert cache.sadd("colours", "red") == 1
        assert cache.get_or_compute("answer", lambda: 42, timeout=60) == 42
    names = [span.name for span in exporter.get_finished_spans()]
    assert "cache.sadd" in names
    assert "cache.get_or_compute" in names
    found = samples(registry)
    assert commands(found, cache="flask", command="add", outcome="stored") >= 1
    assert sample(found, "mcpatterns_events_total", cache="flask", event="recomputed") == 1


def test_the_embedded_flask_backend_accepts_the_instrumentation_options() -> None:
    """As the Django one does: a development config sharing CACHE_OPTIONS with production
    (which turns instrumentation on) keeps working on the embedded store, measuring nothing;
    a misspelt name is still refused."""
    from django_mcpatterns.core.exceptions import ConfigurationError
    from django_mcpatterns.flask import LocMemPatternsCache

    cache = LocMemPatternsCache(
        instrumentation=["prometheus", "opentelemetry"], instrumentation_name="flask"
    )
    assert cache.sadd("colours", "red") == 1
    assert cache.smembers("colours") == {"red"}
    with pytest.raises(ConfigurationError, match="prometheus"):
        LocMemPatternsCache(instrumentation=["prometheus", "statsd"])
