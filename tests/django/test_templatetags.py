"""``{% load mcpatterns %}``: the ``{% cachefragment %}`` tag, on a cluster and embedded.

The tag has the shape and the keys of Django's ``{% cache %}`` and caches with
``get_or_compute``: a stale fragment is served while one request re-renders it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.utils import make_template_fragment_key
from django.template import TemplateSyntaxError, engines
from django.test import override_settings

from django_mcpatterns import signals
from django_mcpatterns.core.stampede import StampedePolicy
from tests.django.conftest import Deployment, DeploymentSuite
from tests.django.test_decorators import SLOW, THREADS, received, run_together
from tests.recompute import drop_recompute, hold_recompute

TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]


def render(source: str, **context: Any) -> str:
    template = engines["django"].from_string("{% load mcpatterns %}" + source)
    return template.render(context)


class Renders:
    """A template variable that counts how often the fragment around it was rendered."""

    def __init__(self, pause: float = 0.0) -> None:
        self.count = 0
        self.pause = pause
        self.fail = False

    def __call__(self) -> int:  # Django templates call callables
        self.count += 1
        time.sleep(self.pause)
        if self.fail:
            raise RuntimeError("database down")
        return self.count


FRAGMENT = "{% cachefragment 60 side %}side #{{ renders }}{% endcachefragment %}"


class TemplateTagsContract(DeploymentSuite):
    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {"default": deployment.params(), "other": deployment.params(KEY_PREFIX="o")}

    @pytest.fixture(autouse=True)
    def _templates(self) -> Iterator[None]:
        with override_settings(TEMPLATES=TEMPLATES):
            yield

    def test_a_fragment_is_rendered_once(self, cache: Any) -> None:
        renders = Renders()
        assert render(FRAGMENT, renders=renders) == "side #1"
        assert render(FRAGMENT, renders=renders) == "side #1"
        assert renders.count == 1
        envelope = cache.get_envelope(make_template_fragment_key("side"))
        assert envelope.soft_expiry == pytest.approx(time.time() + 60, abs=2)

    def test_vary_on(self) -> None:
        renders = Renders()
        source = (
            "{% cachefragment 60 side user lang %}{{ user }} #{{ renders }}{% endcachefragment %}"
        )
        assert render(source, renders=renders, user=1, lang="en") == "1 #1"
        assert render(source, renders=renders, user=2, lang="en") == "2 #2"
        assert render(source, renders=renders, user=1, lang="en") == "1 #1"
        assert render(source, renders=renders, user=1, lang="fr") == "1 #3"

    def test_the_keys_are_those_of_djangos_cache_tag(self, cache: Any) -> None:
        renders = Renders()
        source = "{% cachefragment 60 side user %}#{{ renders }}{% endcachefragment %}"
        render(source, renders=renders, user=7)
        key = make_template_fragment_key("side", [7])
        assert cache.get(key) == "#1"  # a plain get reads the fragment
        # Django's documented invalidation works as for {% cache %}.
        cache.delete(key)
        assert render(source, renders=renders, user=7) == "#2"

    def test_loaded_next_to_djangos_cache_tag(self) -> None:
        renders = Renders()
        source = (
            "{% load cache mcpatterns %}"
            "{% cache 60 plain %}plain #{{ renders }}{% endcache %} "
            "{% cachefragment 60 soft %}soft #{{ renders }}{% endcachefragment %}"
        )
        template = engines["django"].from_string(source)
        assert template.render({"renders": renders}) == "plain #1 soft #2"
        assert template.render({"renders": renders}) == "plain #1 soft #2"

    def test_using_and_template_fragments(self, deployment: Deployment, cache: Any) -> None:
        renders = Renders()
        source = '{% cachefragment 60 side using="other" %}#{{ renders }}{% endcachefragment %}'
        render(source, renders=renders)
        key = make_template_fragment_key("side")
        assert caches["other"].get(key) == "#1"
        assert cache.get(key) is None
        fragments = deployment.params(KEY_PREFIX="fragments")
        with override_settings(
            CACHES={"default": deployment.params(), "template_fragments": fragments}
        ):
            render(FRAGMENT, renders=renders)
            assert caches["template_fragments"].get(key) == "side #2"
            assert caches["default"].get(key) is None

    def test_timeouts(self, cache: Any) -> None:
        renders = Renders()
        source = "{% cachefragment t side %}#{{ renders }}{% endcachefragment %}"
        render(source, renders=renders, t="30")  # a variable, as in {% cache %}
        key = make_template_fragment_key("side")
        assert cache.get_envelope(key).soft_expiry == pytest.approx(time.time() + 30, abs=2)
        cache.clear()
        render(source, renders=renders, t=None)  # never stale
        assert cache.get_envelope(key).soft_expiry == float("inf")
        cache.clear()
        assert render(source, renders=renders, t=0) == "#3"  # not cached
        assert render(source, renders=renders, t=0) == "#4"
        with pytest.raises(TemplateSyntaxError, match="non-integer timeout"):
            render(source, renders=renders, t="soon")

    @pytest.mark.parametrize(
        ("source", "message"),
        [
            ("{% cachefragment 60 %}{% endcachefragment %}", "at least 2 arguments"),
            (
                '{% cachefragment 60 a using="x" using="y" %}{% endcachefragment %}',
                "more than once",
            ),
            ('{% cachefragment 60 a using="nope" %}{% endcachefragment %}', "Invalid cache name"),
            ("{% cachefragment 60 a namespace=none %}{% endcachefragment %}", "namespace must"),
        ],
    )
    def test_errors(self, source: str, message: str) -> None:
        with pytest.raises(TemplateSyntaxError, match=message):
            render(source, none=None)

    def test_a_cache_without_stampede_protection_is_refused(self) -> None:
        locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
        with (
            override_settings(CACHES={"default": locmem}),
            pytest.raises(TemplateSyntaxError, match="no stampede protection"),
        ):
            render(FRAGMENT, renders=Renders())

    def test_a_stale_fragment_is_served_while_another_request_renders(self, cache: Any) -> None:
        renders = Renders()
        render(FRAGMENT, renders=renders)
        key = cache.make_key(make_template_fragment_key("side"))
        assert cache.mark_stale(make_template_fragment_key("side"))
        hold_recompute(cache.store, key)
        with received(signals.stale_served) as stale:
            assert render(FRAGMENT, renders=renders) == "side #1"
        assert [c["key"] for c in stale] == [key]
        drop_recompute(cache.store, key)
        with received(signals.recomputed) as recomputed:
            assert render(FRAGMENT, renders=renders) == "side #2"
        assert [(c["key"], c["reason"]) for c in recomputed] == [(key, "stale")]
        assert render(FRAGMENT, renders=renders) == "side #2"

    def test_a_failing_render_keeps_the_stale_fragment(self, cache: Any) -> None:
        renders = Renders()
        render(FRAGMENT, renders=renders)
        cache.mark_stale(make_template_fragment_key("side"))
        renders.fail = True
        with received(signals.compute_failed) as failed:
            assert render(FRAGMENT, renders=renders) == "side #1"
        assert len(failed) == 1
        cache.clear()
        with pytest.raises(RuntimeError):
            render(FRAGMENT, renders=renders)

    def test_threads_on_a_stale_fragment_render_it_once(self, cache: Any) -> None:
        renders = Renders(pause=SLOW)
        render(FRAGMENT, renders=renders)
        cache.mark_stale(make_template_fragment_key("side"))
        results = run_together(THREADS, lambda: render(FRAGMENT, renders=renders))
        assert renders.count == 2
        assert sorted(results) == ["side #1"] * (THREADS - 1) + ["side #2"]

    def test_threads_on_a_missing_fragment_render_it_once(self) -> None:
        renders = Renders(pause=SLOW)
        results = run_together(THREADS, lambda: render(FRAGMENT, renders=renders))
        assert renders.count == 1
        assert results == ["side #1"] * THREADS

    def test_the_caches_background_runner_is_not_used(self, cache: Any) -> None:
        ran: list[Any] = []
        cache.stampede_policy = StampedePolicy(runner=ran.append)
        try:
            renders = Renders()
            render(FRAGMENT, renders=renders)
            cache.mark_stale(make_template_fragment_key("side"))
            assert render(FRAGMENT, renders=renders) == "side #2"  # rendered in the request
        finally:
            del cache.stampede_policy
        assert ran == []

    def test_namespaces(self, cache: Any) -> None:
        renders = Renders()
        source = (
            "{% cachefragment 60 card namespace=ns %}{{ ns.1 }} #{{ renders }}"
            "{% endcachefragment %}"
        )
        assert render(source, renders=renders, ns=("user", 1)) == "1 #1"
        assert render(source, renders=renders, ns=["user", 1]) == "1 #1"
        assert render(source, renders=renders, ns=("user", 2)) == "2 #2"
        cache.invalidate_namespace("user", 1)
        assert render(source, renders=renders, ns=("user", 1)) == "1 #3"
        assert render(source, renders=renders, ns=("user", 2)) == "2 #2"
        single = '{% cachefragment 60 menu namespace="menus" %}#{{ renders }}{% endcachefragment %}'
        assert render(single, renders=renders) == render(single, renders=renders) == "#4"
        cache.namespace("menus").invalidate()
        assert render(single, renders=renders) == "#5"


class TestThreeServers(TemplateTagsContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestEmbedded(TemplateTagsContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("templatetags")
