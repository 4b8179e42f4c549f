"""Django's own cache tests (``tests/cache/tests.py`` of the installed Django's source
distribution), run against our backends: KetamaMemcacheCache on three real memcached servers,
and LocMemPatternsCache (memcached's semantics, in-process).

``BaseMemcachedTests`` is the suite Django runs against its own memcached backends (62 tests of
``BaseCacheTests`` and 7 of memcached's).  It runs here unchanged, but for three tests that reach
into pymemcache's internals (``_servers``, ``_class.disconnect_all``, ``_class.set_multi``): one
is restated through our backend's public face, the others are skipped naming the test of ours
that holds the same behaviour.
"""

from __future__ import annotations

import unittest

from cache.tests import (  # Django's tests/, on sys.path (settings.py)
    BaseMemcachedTests,
    caches_setting_for_tests,
    memcached_excluded_caches,
)
from django.core.cache import cache
from django.test import TestCase, override_settings

from upstream.django_cache.servers import location

KETAMA = {
    "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
    "LOCATION": location(),
}
EMBEDDED = {"BACKEND": "django_mcpatterns.backend.LocMemPatternsCache"}


class OurMemcachedTests(BaseMemcachedTests):
    # Connections are pooled per process (as PyLibMCCache's are), not dropped per request.
    should_disconnect_on_close = False

    @unittest.skip(
        "mocks pymemcache's disconnect_all; close() keeps the pool: tests/django/"
        "test_backend_contract.py::test_close_between_requests_keeps_node_health"
    )
    def test_close(self) -> None: ...

    @unittest.skip(
        "mocks pymemcache's set_multi; real refusals: tests/django/test_backend_contract.py"
        "::test_set_many_returns_the_keys_that_failed"
    )
    def test_set_many_returns_failing_keys(self) -> None: ...


@override_settings(CACHES=caches_setting_for_tests(base=KETAMA, exclude=memcached_excluded_caches))
class KetamaMemcacheCacheTests(OurMemcachedTests, TestCase):
    base_params = KETAMA

    def test_location_multiple_servers(self) -> None:
        # Django's reads pymemcache's parsed _servers; ours names them with the default port.
        for given in (
            ["server1.tld", "server2:11211"],
            "server1.tld;server2:11211",
            "server1.tld,server2:11211",
        ):
            params = {"BACKEND": self.base_params["BACKEND"], "LOCATION": given}
            with self.subTest(location=given), self.settings(CACHES={"default": params}):
                assert cache.client_servers == ["server1.tld:11211", "server2:11211"]


@override_settings(
    CACHES=caches_setting_for_tests(base=EMBEDDED, exclude=memcached_excluded_caches)
)
class LocMemPatternsCacheTests(OurMemcachedTests, TestCase):
    base_params = EMBEDDED

    @unittest.skip("LOCATION names the embedded store, not servers")
    def test_location_multiple_servers(self) -> None: ...
