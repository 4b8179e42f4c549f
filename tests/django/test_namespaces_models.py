"""``invalidate_on_change``: saving or deleting a model instance invalidates namespaces.

A real model on SQLite in memory (``tests/django/settings.py``), saved and
deleted through the ORM, inside and outside transactions: the invalidation
waits for the commit, so a reader between the save and the commit cannot cache
the old rows under the new version.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connection, models, transaction
from django.test import override_settings

from django_mcpatterns import signals
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.receivers import NamespaceReceiver, invalidate_on_change
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import LOOPBACK, MemcachedServer, free_port, memcached_cluster

pytestmark = pytest.mark.django_db(transaction=True)


class Article(models.Model):
    id = models.AutoField(primary_key=True)
    org_id = models.IntegerField()
    author_id = models.IntegerField()
    title = models.CharField(max_length=100)

    class Meta:
        app_label = "mcpatterns_tests"  # not an installed app: the table is made below


@pytest.fixture(autouse=True)
def table() -> Iterator[None]:
    with connection.schema_editor() as editor:
        editor.create_model(Article)
    yield
    with connection.schema_editor() as editor:
        editor.delete_model(Article)


@pytest.fixture(autouse=True)
def cache() -> Iterator[Any]:
    entry = {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "namespaces-models"}
    with override_settings(CACHES={"default": entry}):
        caches["default"].clear()
        yield caches["default"]


@pytest.fixture
def connect() -> Iterator[Any]:
    """``invalidate_on_change`` whose receivers are disconnected after the test."""
    made: list[NamespaceReceiver] = []

    def connect(*args: Any, **kwargs: Any) -> NamespaceReceiver:
        made.append(invalidate_on_change(*args, **kwargs))
        return made[-1]

    yield connect
    for receiver in made:
        receiver.disconnect()


def test_save_and_delete_invalidate_the_namespace(cache: Any, connect: Any) -> None:
    connect(Article, lambda article: ("author", article.author_id))
    author, other = cache.namespace("author", 7), cache.namespace("author", 8)
    author.set("titles", [])
    other.set("titles", [])
    article = Article.objects.create(org_id=1, author_id=7, title="first")
    assert author.get("titles") is None
    assert other.get("titles") == []
    author.set("titles", ["first"])
    article.delete()
    assert author.get("titles") is None


def test_the_invalidation_waits_for_the_commit(cache: Any, connect: Any) -> None:
    connect(Article, lambda article: ("author", article.author_id))
    author = cache.namespace("author", 7)
    author.set("titles", [])
    with transaction.atomic():
        Article.objects.create(org_id=1, author_id=7, title="first")
        # Not committed: other connections still read the old rows, so the old
        # cached value is still the right one.
        assert author.get("titles") == []
    assert author.get("titles") is None


def test_a_rolled_back_change_invalidates_nothing(cache: Any, connect: Any) -> None:
    connect(Article, lambda article: ("author", article.author_id))
    author = cache.namespace("author", 7)
    author.set("titles", [])

    def create_then_fail() -> None:
        with transaction.atomic():
            Article.objects.create(org_id=1, author_id=7, title="first")
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        create_then_fail()
    assert author.get("titles") == []


def test_several_and_nested_namespaces(cache: Any, connect: Any) -> None:
    def namespaces(article: Article) -> list[Any]:
        return [
            ("author", article.author_id),
            cache.namespace("org", article.org_id).namespace("titles"),
            None,
        ]

    connect(Article, namespaces)
    author = cache.namespace("author", 7)
    titles = cache.namespace("org", 1).namespace("titles")
    org = cache.namespace("org", 1)
    for ns in (author, titles, org):
        ns.set("k", "v")
    Article.objects.create(org_id=1, author_id=7, title="first")
    assert author.get("k") is None
    assert titles.get("k") is None
    assert org.get("k") == "v"  # only the nested level was invalidated


def test_a_single_part_and_none(cache: Any, connect: Any) -> None:
    connect(Article, lambda article: "articles" if article.title else None)
    ns = cache.namespace("articles")
    ns.set("k", "v")
    Article.objects.create(org_id=1, author_id=7, title="")
    assert ns.get("k") == "v"
    Article.objects.create(org_id=1, author_id=7, title="t")
    assert ns.get("k") is None


def test_disconnect(cache: Any) -> None:
    receiver = invalidate_on_change(Article, lambda article: ("author", article.author_id))
    receiver.disconnect()
    author = cache.namespace("author", 7)
    author.set("k", "v")
    Article.objects.create(org_id=1, author_id=7, title="first")
    assert author.get("k") == "v"


@pytest.fixture
def unreachable() -> Iterator[None]:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": f"{LOOPBACK}:{free_port()}",
        "OPTIONS": {"on_outage": "raise"},
    }
    with override_settings(CACHES={"default": entry}):
        yield


@pytest.fixture
def stopped_server() -> Iterator[MemcachedServer]:
    """A real memcached, started for the test; the test stops it."""
    with memcached_cluster(1) as servers:
        yield servers[0]


@pytest.mark.usefixtures("reset_shared_stores")
@pytest.mark.parametrize("raise_errors", [False, True])
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_stopped_server_never_makes_save_fail_it_logs_and_signals(
    connect: Any,
    stopped_server: MemcachedServer,
    caplog: pytest.LogCaptureFixture,
    raise_errors: bool,
    atomic: bool,
) -> None:
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": stopped_server.spec,
        "OPTIONS": {
            "raise_errors": raise_errors,
            "timeout": 1,
            "connect_timeout": 1,
            "on_outage": "raise",
        },
    }
    failures: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        failures.append({"sender": sender, **kwargs})

    signals.invalidation_failed.connect(receiver)
    try:
        with override_settings(CACHES={"default": entry}):
            connect(Article, lambda article: [("author", article.author_id), "articles"])
            author = caches["default"].namespace("author", 7)
            author.set("titles", ["old"])
            assert author.get("titles") == ["old"]
            stopped_server.stop()
            if atomic:
                with transaction.atomic():
                    article = Article.objects.create(org_id=1, author_id=7, title="first")
            else:
                article = Article.objects.create(org_id=1, author_id=7, title="first")
            article.title = "second"
            article.save()
            article.delete()
    finally:
        signals.invalidation_failed.disconnect(receiver)
    assert Article.objects.count() == 0  # every change committed: only the invalidations failed
    # Three changes, two namespaces each: every one tried, logged and signalled.
    assert len(failures) == 6
    assert {f["sender"] for f in failures} == {Article}
    assert [f["target"] for f in failures[:2]] == [("author", 7), "articles"]
    assert all(f["cache"] == "default" for f in failures)
    assert all(isinstance(f["error"], NodeUnavailableError) for f in failures)
    assert caplog.text.count("could not invalidate") == 6


@pytest.mark.usefixtures("reset_shared_stores")
@pytest.mark.parametrize("atomic", [False, True], ids=["autocommit", "atomic"])
def test_a_stopped_server_degrades_invalidations_to_repairs_and_signals_them(
    connect: Any, stopped_server: MemcachedServer, atomic: bool
) -> None:
    # OPTIONS["on_outage"] = "degrade", the default: the invalidations are not failures but
    # repairs, sent as write_degraded; the namespaces' version keys are deleted once it is back.
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": stopped_server.spec,
        "OPTIONS": {"timeout": 1, "connect_timeout": 1, "retry_timeout": 0.1},
    }
    degraded: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []

    def on_degraded(sender: Any, **kwargs: Any) -> None:
        degraded.append(kwargs)

    def on_failed(sender: Any, **kwargs: Any) -> None:
        failed.append(kwargs)

    signals.write_degraded.connect(on_degraded)
    signals.invalidation_failed.connect(on_failed)
    try:
        with override_settings(CACHES={"default": entry}):
            connect(Article, lambda article: [("author", article.author_id), "articles"])
            cache = caches["default"]
            author = cache.namespace("author", 7)
            author.set("titles", ["old"])
            stopped_server.pause()
            try:
                if atomic:
                    with transaction.atomic():
                        Article.objects.create(org_id=1, author_id=7, title="first")
                else:
                    Article.objects.create(org_id=1, author_id=7, title="first")
                assert cache.store.journal() == {stopped_server.spec: 2}
            finally:
                stopped_server.resume()
            deadline = time.monotonic() + 10  # once its retry wait is over: a request, or
            while cache.store.journal() and time.monotonic() < deadline:  # the repair thread
                author.get("titles")
                time.sleep(0.01)
            assert cache.store.journal() == {}
            assert author.get("titles") is None  # invalidated after all: never read stale
    finally:
        signals.write_degraded.disconnect(on_degraded)
        signals.invalidation_failed.disconnect(on_failed)
    assert Article.objects.count() == 1
    assert failed == []
    assert [d["command"] for d in degraded] == ["invalidate_namespace"] * 2


@pytest.mark.usefixtures("unreachable", "reset_shared_stores")
def test_robust_is_accepted_and_changes_nothing(
    connect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    connect(Article, lambda article: ("author", article.author_id), robust=True)
    Article.objects.create(org_id=1, author_id=7, title="first")
    assert Article.objects.count() == 1
    assert "NodeUnavailableError" in caplog.text
