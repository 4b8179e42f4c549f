"""The status view and the counters it shows, through Django's test client."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.core.cache import caches
from django.test import Client, override_settings
from django.urls import include, path

from django_mcpatterns import signals
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.counters import COUNTED, counters
from django_mcpatterns.views import StatusView, debug_or_staff, is_staff
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer
from tests.links import broken, served_by_django

pytestmark = pytest.mark.usefixtures("reset_shared_stores")

DOCS_ADDRESS = "https://docs.example.com/operations/#metrics-and-traces"

urlpatterns = [
    path("staff/", include("django_mcpatterns.urls")),
    path("open/", StatusView.as_view(permission=lambda request: True)),
    path("debug/", StatusView.as_view(permission=debug_or_staff)),
    path("only-sessions/", StatusView.as_view(permission=lambda r: True, aliases=["sessions"])),
    path("linked/", StatusView.as_view(permission=lambda r: True, metrics_docs=DOCS_ADDRESS)),
]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    counters.reset()
    with override_settings(ROOT_URLCONF=__name__, TEMPLATES=TEMPLATES, DEBUG=False):
        yield
    counters.reset()


def page(url: str, status: int = 200) -> str:
    response = Client().get(url)
    assert response.status_code == status
    return response.content.decode()


def test_staff_only_by_default():
    page("/staff/", 403)
    staff = SimpleNamespace(is_active=True, is_staff=True)
    assert is_staff(SimpleNamespace(user=staff))
    assert not is_staff(SimpleNamespace(user=SimpleNamespace(is_active=True, is_staff=False)))
    assert not is_staff(SimpleNamespace())  # no auth middleware: no user


def test_debug_or_staff_opens_the_page_in_development():
    page("/debug/", 403)
    with override_settings(DEBUG=True):
        page("/debug/")


def test_cluster_section_has_the_ring_chart_health_and_stats(memcached_3: list[MemcachedServer]):
    specs = [s.spec for s in memcached_3]
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs, "OPTIONS": {"ketama": "twemproxy"}}
    with override_settings(CACHES={"default": entry}):
        html = page("/open/")
    assert "ketama “twemproxy”" in html
    assert len(re.findall(r'<circle class="arc"', html)) > 3 * 10  # interleaved arcs
    shares = re.findall(r'<td class="share">([\d.]+)%</td>', html)
    assert len(shares) == 3
    assert sum(map(float, shares)) == pytest.approx(100, abs=0.2)
    for spec in specs:
        assert f'<tr data-node="{spec}">' in html
    assert html.count('class="state state-up"') == 3
    assert len(re.findall(r'<td class="hits">\d+</td>', html)) == 3


def test_status_page_is_never_cached():
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}}):
        response = Client().get("/open/")
    assert "no-cache" in response.headers["Cache-Control"]


def test_embedded_section_and_broken_caches():
    caches_setting = {
        "default": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "status-page"},
        "sessions": {"BACKEND": CLUSTER_BACKEND, "LOCATION": "127.0.0.1:1:1 x"},  # names: E004
    }
    with override_settings(CACHES=caches_setting):
        caches["default"].get("missing")
        html = page("/open/")
        only_sessions = page("/only-sessions/")
    assert 'id="cache-default"' in html
    assert "no servers, no ring" in html
    assert '<span class="state state-embedded">embedded</span>' in html
    assert '<td class="misses">1</td>' in html  # the in-process store counts reads too
    assert (
        "could not be inspected: ImproperlyConfigured: django-mcpatterns cache configuration: "
        "server names only apply" in html
    )
    assert 'id="cache-default"' not in only_sessions


def test_counters_count_signals_and_show_on_the_page():
    signals.node_dead.send(sender=Cluster, node="127.0.0.1:1", error=None)
    signals.node_dead.send(sender=Cluster, node="127.0.0.1:2", error=None)
    signals.node_revived.send(sender=Cluster, node="127.0.0.1:1", error=None)
    assert counters.get("node_dead") == 2
    assert counters.get("node_revived") == 1
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}}):
        html = page("/open/")
    assert re.search(
        r'data-counter="node_dead"><td>Servers marked dead</td><td class="count">2<', html
    )
    # Every COUNTED signal that signals.py defines is shown, in COUNTED's order.
    shown = re.findall(r'data-counter="(\w+)"', html)
    assert shown == [name for name in COUNTED if hasattr(signals, name)]


def test_stampede_events_are_counted():
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "cnt"}}):
        cache = caches["default"]
        if not hasattr(cache, "get_or_compute"):
            pytest.skip("get_or_compute is not on the backend yet")
        cache.get_or_compute("counted", lambda: 1, timeout=60)
    assert counters.get("recomputed") == 1


@pytest.mark.parametrize("instrumentation", ["opentelemetry", "prometheus"])
def test_instrumented_caches_show_commands_per_server_and_events(
    memcached_3: list[MemcachedServer], instrumentation: str
):
    from prometheus_client import CollectorRegistry

    from django_mcpatterns.core.observe import tally

    tally.reset()
    specs = [s.spec for s in memcached_3]
    # Counted by the process tally, or read back from the Prometheus metrics.
    options = {"instrumentation": [instrumentation], "prometheus_registry": CollectorRegistry()}
    caches_setting = {
        "default": {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs, "OPTIONS": options},
        "plain": {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs},
    }
    with override_settings(CACHES=caches_setting):
        cache = caches["default"]
        cache.delete("status-page-key")
        cache.get_or_compute("status-page-key", lambda: 1, timeout=60)
        cache.get("status-page-key")
        held_by = cache.store.ring.get_node(cache.make_key("status-page-key").encode())
        html = page("/open/")
    section = html.split('id="cache-default"')[1].split("</section>")[0]
    counted = re.findall(
        r'<tr data-node="([^"]+)">\s*<td>[^<]+</td>\s*<td class="count">(\d+)', section
    )
    # delete; mg+ms (the recompute's claim: two commands); cas (its fill); get; and the
    # page's own stats, sent before the counts are read.
    assert dict(counted)[held_by] == "6"
    assert 'data-event="recomputed"' in section
    assert "hit 1" in section  # the get, by outcome
    plain = html.split('id="cache-plain"')[1].split("</section>")[0]
    assert 'OPTIONS["instrumentation"]' in plain  # not counted: says how to turn it on
    # Where the docs are served is the site's to say: by default the section is named, and
    # nothing links to a path of the repository (docs/operations.md: a 404 on every site).
    assert "“Metrics and traces” in the operations documentation" in html
    assert "docs/operations.md" not in html
    assert broken(html, "/open/", served_by_django) == []


def test_the_metrics_documentation_is_a_link_once_the_site_says_where(
    memcached_3: list[MemcachedServer],
):
    specs = [s.spec for s in memcached_3]
    with override_settings(CACHES={"default": {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs}}):
        html = page("/linked/")
    assert f'<a href="{DOCS_ADDRESS}">metrics documentation</a>' in html
    assert broken(html, "/linked/", served_by_django) == []


def test_every_link_of_the_status_page_is_served(memcached_3: list[MemcachedServer]):
    specs = [s.spec for s in memcached_3]
    caches_setting = {
        "default": {"BACKEND": CLUSTER_BACKEND, "LOCATION": specs},
        "embedded": {"BACKEND": EMBEDDED_BACKEND},
    }
    with override_settings(CACHES=caches_setting):
        html = page("/open/")
    assert 'id="cache-embedded"' in html
    assert broken(html, "/open/", served_by_django) == []
