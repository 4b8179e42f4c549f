"""Locks and get_or_compute on the Django backends: keys, timeouts, signals.

The algorithms are proven in ``tests/core``; here they are reached the way a
project reaches them (``caches[...]`` built from ``settings.CACHES``), on a
3-server cluster and on the embedded store: Django's key rules apply to lock
and value keys, Django's timeout conventions to soft expiry, plain reads never
see the envelope, and the core's events arrive as Django signals.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.utils import make_template_fragment_key
from django.http import HttpRequest, HttpResponse
from django.template import Context, Engine
from django.test import RequestFactory
from django.utils.cache import get_cache_key
from django.views.decorators.cache import cache_page

from django_mcpatterns import signals
from django_mcpatterns.core.exceptions import LockNotOwnedError
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.stampede import StampedePolicy
from django_mcpatterns.patterns.events import SIGNAL_NAMES
from tests.django.conftest import Deployment, DeploymentSuite, received
from tests.recompute import drop_recompute, hold_recompute


class Boom(Exception):
    pass


@pytest.mark.parametrize(("event_type", "name"), SIGNAL_NAMES.items())
def test_each_core_event_is_sent_as_its_signal(event_type: type, name: str) -> None:
    event = event_type(**{f.name: f"{f.name}-value" for f in dataclasses.fields(event_type)})
    cache, signal = object(), getattr(signals, name)
    with received(signal) as calls:
        signals.send_pattern_event(cache, event)
    assert calls == [{"sender": object, "signal": signal, "cache": cache, **vars(event)}]


class LocksStampedeContract(DeploymentSuite):
    """Run against every deployment; subclasses provide ``deployment``."""

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {
            "default": deployment.params(),
            "prefixed": deployment.params(KEY_PREFIX="site2", VERSION=3),
            "forever": deployment.params(TIMEOUT=None),
        }

    # -- locks --

    def test_lock_uses_the_cache_key_rules(self, cache: Any) -> None:
        prefixed = caches["prefixed"]
        with prefixed.lock("job", timeout=5) as lock:
            assert isinstance(lock, Lock)
            assert lock.key == prefixed.make_key("job") == "site2:3:job"
            assert prefixed.get("job") == lock.token
            assert cache.lock("job").acquire(blocking=False)  # another prefix: another lock
        assert prefixed.get("job") is None

    def test_lock_release_by_a_lapsed_owner_raises(self, cache: Any) -> None:
        late = cache.lock("lapse", timeout=1)
        assert late.acquire()
        other = cache.lock("lapse", timeout=10, blocking_timeout=5)
        assert other.acquire()
        with pytest.raises(LockNotOwnedError):
            late.release()
        assert other.owned()

    def test_lock_signals_waits_and_timeouts(self, cache: Any) -> None:
        holder = cache.lock("busy", timeout=1)
        holder.acquire()
        with received(signals.lock_timed_out) as timed_out:
            assert cache.lock("busy", blocking_timeout=0.05).acquire() is False
        with received(signals.lock_waited) as waited:
            assert cache.lock("busy", blocking_timeout=5).acquire() is True
        assert [c["key"] for c in timed_out] == [cache.make_key("busy")]
        assert 0.05 <= timed_out[0]["waited"] < 1
        assert waited[0]["sender"] is type(cache)
        assert waited[0]["cache"] is cache
        assert 0 < waited[0]["waited"] <= 3  # the holder's 1 s lock lapses within 2 s

    def test_lock_decorator(self, cache: Any) -> None:
        @cache.lock("decorated", timeout=5, blocking=False)
        def job() -> bool:
            return bool(cache.get("decorated"))

        assert job() is True
        assert cache.get("decorated") is None

    # -- get_or_compute --

    def test_get_or_compute_and_plain_reads(self, cache: Any) -> None:
        calls = []

        def compute() -> dict[str, int]:
            calls.append(1)
            return {"total": 42}

        assert cache.get_or_compute("report", compute, 60) == {"total": 42}
        assert cache.get_or_compute("report", compute, 60) == {"total": 42}
        assert len(calls) == 1
        # The envelope never reaches users of the ordinary cache API.
        assert cache.get("report") == {"total": 42}
        assert cache.get_many(["report"]) == {"report": {"total": 42}}
        assert cache.get_or_set("report", "other") == {"total": 42}
        assert cache.has_key("report")

    def test_plain_reads_miss_once_the_timeout_has_passed(self, cache: Any) -> None:
        # Issue 12, point 5: get, has_key, get_many, {% cache %} and cache_page
        # returned a get_or_compute value until soft + grace, not for its timeout.
        grace = StampedePolicy(grace=60)  # memcached keeps the item well past the test
        renders: list[int] = []

        @cache_page(60)
        def page(request: HttpRequest) -> HttpResponse:
            renders.append(1)
            return HttpResponse(f"render {len(renders)}")

        request = RequestFactory().get("/page")
        assert page(request).content == b"render 1"  # cached by cache_page, plainly
        page_key = get_cache_key(request, cache=cache)
        cached_page = cache.get(page_key)
        cache.recompute(page_key, lambda: cached_page, 2, policy=grace)  # now an envelope
        fragment_key = make_template_fragment_key("sidebar")
        cache.recompute(fragment_key, lambda: "old fragment", 2, policy=grace)
        cache.recompute("report", lambda: "old", 2, policy=grace)
        fragment = Engine(libraries={"cache": "django.templatetags.cache"}).from_string(
            "{% load cache %}{% cache 60 sidebar %}{{ fresh }}{% endcache %}"
        )
        context = Context({"fresh": "new fragment"})
        assert cache.get("report") == "old"
        assert fragment.render(context) == "old fragment"
        assert page(request).content == b"render 1"
        # Just past the timeout (soft expiries are exact), well within the grace.
        soft = max(cache.get_envelope(k).soft_expiry for k in (page_key, fragment_key, "report"))
        time.sleep(max(0.0, soft - time.time()) + 0.05)
        assert cache.get("report") is None
        assert cache.get("report", "default") == "default"
        assert not cache.has_key("report")
        assert cache.get_many(["report", "other"]) == {}
        assert fragment.render(context) == "new fragment"
        assert page(request).content == b"render 2"
        # get_or_compute still has it: served stale while one caller recomputes.
        served: list[str] = []

        def recompute() -> str:
            served.append(cache.get_or_compute("report", lambda: "never", 1))
            return "new"

        # memcached hands its recompute token out within a tick or two of the soft
        # expiry; until then each caller is served the stale value (docs/stampede.md).
        for _ in range(100):  # a hang guard
            got = cache.get_or_compute("report", recompute, 60)
            if got == "new":
                break
            assert (got, served) == ("old", [])
            time.sleep(0.05)
        assert got == "new"
        assert served == ["old"]
        assert cache.get("report") == "new"

    def test_get_or_compute_result_says_what_happened(self, cache: Any) -> None:
        first = cache.get_or_compute_result("r", lambda: "v", 60)
        again = cache.get_or_compute_result("r", lambda: "w", 60)
        assert (first.outcome, again.outcome) == ("computed", "fresh")
        assert again.envelope == cache.get_envelope("r")
        assert again.envelope.soft_expiry == pytest.approx(time.time() + 60, abs=2)

    def test_timeouts_follow_django_conventions(self, cache: Any) -> None:
        cache.get_or_compute("default", lambda: 1)  # the cache's TIMEOUT: 300 s
        envelope = cache.get_envelope("default")
        assert envelope.soft_expiry == pytest.approx(time.time() + 300, abs=2)
        assert envelope.hard_expiry == pytest.approx(time.time() + 600, abs=2)  # + grace
        cache.get_or_compute("never", lambda: 1, None)
        assert cache.get_envelope("never").soft_expiry == float("inf")
        caches["forever"].get_or_compute("forever", lambda: 1)
        assert caches["forever"].get_envelope("forever").soft_expiry == float("inf")
        assert cache.get_or_compute("zero", lambda: 1, 0) == 1
        assert cache.get("zero") is None  # timeout 0: not cached, as in Django
        sixty_days = 60 * 86400
        cache.get_or_compute("long", lambda: 1, sixty_days)  # absolute exptime in Django
        assert cache.get_envelope("long").soft_expiry == pytest.approx(
            time.time() + sixty_days, abs=2
        )

    def test_keys_and_versions(self, cache: Any) -> None:
        prefixed = caches["prefixed"]
        prefixed.get_or_compute("k", lambda: "v3", 60)
        assert prefixed.get("k") == "v3"
        assert cache.get("k") is None
        assert prefixed.get_or_compute("k", lambda: "v4", 60, version=4) == "v4"
        assert prefixed.get("k", version=4) == "v4"

    def test_memcached_keeps_soft_plus_grace(self, cache: Any, deployment: Deployment) -> None:
        deployment.require_servers()
        cache.get_or_compute("ttl", lambda: 1, 50, policy=StampedePolicy(grace=100))
        assert deployment.ttl(cache.make_key("ttl")) in (150, 151)

    def test_mark_stale_then_one_recompute_with_signals(self, cache: Any) -> None:
        cache.get_or_compute("page", lambda: "old", 60)
        assert cache.mark_stale("page") is True
        # Someone else is recomputing: this caller is served the stale value.
        hold_recompute(cache.store, cache.make_key("page"))
        with received(signals.stale_served) as stale:
            assert cache.get_or_compute("page", lambda: "new", 60) == "old"
        assert stale[0]["key"] == cache.make_key("page")
        assert 0 <= stale[0]["age"] < 2
        drop_recompute(cache.store, cache.make_key("page"))
        with received(signals.recomputed) as recomputed:
            assert cache.get_or_compute("page", lambda: "new", 60) == "new"
        (call,) = recomputed
        assert call["reason"] == "stale"
        assert call["background"] is False
        assert call["compute_time"] >= 0

    def test_compute_errors_serve_stale_and_are_signalled(self, cache: Any) -> None:
        cache.get_or_compute("fragile", lambda: "old", 60)
        cache.mark_stale("fragile")

        def failing() -> str:
            raise Boom("database down")

        with received(signals.compute_failed) as failed:
            assert cache.get_or_compute("fragile", failing, 60) == "old"
        assert isinstance(failed[0]["error"], Boom)
        with pytest.raises(Boom):
            cache.get_or_compute("cold", failing, 60)

    def test_recompute(self, cache: Any) -> None:
        cache.get_or_compute("x", lambda: 1, 60)
        with received(signals.recomputed) as recomputed:
            assert cache.recompute("x", lambda: 2, 60) == 2
        assert recomputed[0]["reason"] == "refresh"
        assert cache.get("x") == 2

    def test_the_cache_wide_default_policy(self, cache: Any) -> None:
        cache.stampede_policy = StampedePolicy(grace=7)
        cache.get_or_compute("g", lambda: 1, 10)
        envelope = cache.get_envelope("g")
        assert envelope.hard_expiry - envelope.soft_expiry == pytest.approx(7)


class TestThreeServers(LocksStampedeContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestEmbedded(LocksStampedeContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("locks-stampede")
