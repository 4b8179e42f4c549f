"""System checks: each id fires on the configuration it names, and says what the backend says.

Errors must carry, word for word, the ``ImproperlyConfigured`` the backend
raises for the same ``CACHES`` entry (ring errors included, found when it is
built): the checks build the backend rather than re-validating.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core import checks
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings
from django.urls import path

from django_mcpatterns.checks import check_caches, check_installed, check_status_page
from django_mcpatterns.views import StatusView, debug_or_staff
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND

pytestmark = pytest.mark.usefixtures("reset_shared_stores")

LOCAL = ["127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11213"]

# ROOT_URLCONF for the status page checks: this module.
urlpatterns = [
    path("status/", StatusView.as_view()),
    path("open-status/", StatusView.as_view(permission=debug_or_staff)),
]


def run(location: Any = LOCAL, backend: str = CLUSTER_BACKEND, **options: Any) -> list[Any]:
    entry: dict[str, Any] = {"BACKEND": backend, "LOCATION": location}
    if options:
        entry["OPTIONS"] = options
    with override_settings(CACHES={"default": entry}):
        return check_caches(None)


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def only(messages: list[Any], check_id: str) -> Any:
    assert ids(messages) == [check_id], [str(m) for m in messages]
    return messages[0]


def backend_error(location: Any = LOCAL, backend: str = CLUSTER_BACKEND, **options: Any) -> str:
    """What Django raises for the same entry when it builds the cache."""
    entry: dict[str, Any] = {"BACKEND": backend, "LOCATION": location}
    if options:
        entry["OPTIONS"] = options
    with override_settings(CACHES={"default": entry}), pytest.raises(ImproperlyConfigured) as exc:
        caches["default"]
    return str(exc.value)


# -- a sound configuration ------------------------------------------------------


def test_a_sound_cluster_and_the_embedded_store_pass_every_check():
    assert run() == []
    assert run(["unix:/run/memcached.sock", "localhost:11212", "[::1]:11213"]) == []
    assert run("example", backend=EMBEDDED_BACKEND, max_bytes=2**22) == []


def test_checks_are_registered_and_name_the_alias():
    # A warning: the backend accepts the entry, so Django's own check runs on.
    entry = {
        "BACKEND": CLUSTER_BACKEND,
        "LOCATION": ["127.0.0.1:11211"],
        "OPTIONS": {"failover": "remap"},
    }
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}, "sessions": entry}):
        messages = checks.run_checks(tags=[checks.Tags.caches])
    ours = [m for m in messages if m.id.startswith("mcpatterns.")]
    assert ids(ours) == ["mcpatterns.W002"]
    assert str(ours[0]).startswith("CACHES['sessions']: (mcpatterns.W002) ")


def test_an_entry_the_backend_refuses_stops_djangos_own_check_with_the_same_words():
    # Django (caches.W003) builds every cache while checking, so the backend's
    # ImproperlyConfigured stops the run; our E001 says the same when called.
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": LOCAL, "OPTIONS": {"ketama": "nope"}}
    with override_settings(CACHES={"default": entry}):
        (error,) = check_caches(None)
        with pytest.raises(ImproperlyConfigured) as raised:
            checks.run_checks(tags=[checks.Tags.caches])
    assert error.id == "mcpatterns.E001"
    assert str(raised.value) == error.msg


def test_caches_of_other_backends_are_left_alone():
    entry = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "x"}
    with override_settings(CACHES={"default": entry}):
        assert check_caches(None) == []


# -- errors: the backend's own words ----------------------------------------------


def test_e001_unknown_ketama_variant():
    error = only(run(ketama="ketama"), "mcpatterns.E001")
    assert error.level == checks.ERROR
    assert error.msg == backend_error(ketama="ketama")
    assert "'libmemcached'" in error.msg
    assert "'twemproxy'" in error.msg


@pytest.mark.parametrize(
    "location",
    ["10.0.0.1:port", "10.0.0.1:11211:0", "10.0.0.1:99999", "", ["127.0.0.1:11211", "a:b:c:d"]],
)
def test_e002_malformed_location(location):
    error = only(run(location), "mcpatterns.E002")
    assert error.msg == backend_error(location)


def test_e003_a_server_listed_twice():
    location = ["127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11211:2"]
    error = only(run(location), "mcpatterns.E003")
    assert error.msg == backend_error(location)
    assert "127.0.0.1:11211 is listed twice" in error.msg


def test_e003_two_servers_that_are_one_ketama_server():
    # Different addresses with the same twemproxy name hash the same points.
    location = ["127.0.0.1:11211:1 cache", "127.0.0.1:11212:1 cache"]
    error = only(run(location, ketama="twemproxy"), "mcpatterns.E003")
    assert error.msg == backend_error(location, ketama="twemproxy")


def test_e004_twemproxy_names_with_another_variant():
    location = ["127.0.0.1:11211:1 alpha", "127.0.0.1:11212:1 beta"]
    error = only(run(location, ketama="libmemcached"), "mcpatterns.E004")
    assert error.msg == backend_error(location, ketama="libmemcached")
    assert "twemproxy" in error.hint
    assert run(location, ketama="twemproxy-fnv1a_64") == []


@pytest.mark.parametrize(
    ("backend", "location", "options"),
    [
        (CLUSTER_BACKEND, LOCAL, {"retry_attempts": 0}),
        (CLUSTER_BACKEND, LOCAL, {"failover": "retry"}),
        (CLUSTER_BACKEND, LOCAL, {"protocol": "binary"}),
        (CLUSTER_BACKEND, LOCAL, {"timeout": -1}),
        (CLUSTER_BACKEND, LOCAL, {"retry_attemps": 3}),  # misspelt: not a pymemcache argument
        (CLUSTER_BACKEND, LOCAL, {"default_noreply": True}),  # ours to manage
        (EMBEDDED_BACKEND, "x", {"max_bytes": -1}),
        (EMBEDDED_BACKEND, "x", {"ketama": "libmemcached"}),
        (EMBEDDED_BACKEND, "x", {"max_bytes": 4096, "max_item_size": 8192}),
    ],
)
def test_e005_invalid_or_unknown_options(backend, location, options):
    error = only(run(location, backend, **options), "mcpatterns.E005")
    assert error.msg == backend_error(location, backend, **options)


@pytest.mark.usefixtures("reset_shared_stores")
def test_e005_embedded_caches_sharing_a_location_with_other_serde_options() -> None:
    setting = {
        "default": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "one-store"},
        "signed": {
            "BACKEND": EMBEDDED_BACKEND,
            "LOCATION": "one-store",
            "OPTIONS": {"signing_key": "s" * 32},
        },
    }
    with override_settings(CACHES=setting):
        error = only(check_caches(None), "mcpatterns.E005")
    assert error.obj == "CACHES['signed']"
    assert "its own LOCATION" in error.msg


# -- warnings ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["libmemcached-ketama", "spymemcached"])
def test_w001_weights_the_variant_applies_differently(variant):
    location = ["127.0.0.1:11211:2", "127.0.0.1:11212"]
    warning = only(run(location, ketama=variant), "mcpatterns.W001")
    assert warning.level == checks.WARNING
    assert "127.0.0.1:11211" in warning.msg
    assert run(["127.0.0.1:11211:1", "127.0.0.1:11212:1"], ketama=variant) == []


@pytest.mark.parametrize("variant", ["libmemcached", "libketama", "twemproxy"])
def test_w001_not_for_variants_that_weigh_servers_as_given(variant):
    assert run(["127.0.0.1:11211:2", "127.0.0.1:11212"], ketama=variant) == []


def test_w002_remap_with_a_single_server():
    only(run(["127.0.0.1:11211"], failover="remap"), "mcpatterns.W002")
    assert run(LOCAL, failover="remap") == []


def test_w003_dead_timeout_shorter_than_retry_timeout():
    warning = only(run(retry_timeout=5, dead_timeout=2), "mcpatterns.W003")
    assert "dead_timeout (2 s)" in warning.msg
    assert "retry_timeout (5 s)" in warning.msg
    assert run(retry_timeout=5, dead_timeout=5) == []


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"timeout": None}, "timeout is None"),
        ({"connect_timeout": None}, "connect_timeout is None"),
        ({"timeout": None, "connect_timeout": None}, "connect_timeout and timeout are None"),
    ],
)
def test_w004_no_timeout(options, named):
    warning = only(run(**options), "mcpatterns.W004")
    assert warning.msg.startswith(named + ": a server that hangs")


def test_w005_pickle_beyond_loopback_names_the_servers():
    location = ["127.0.0.1:11211", "10.0.0.7:11211", "cache.internal:11211"]
    warning = only(run(location), "mcpatterns.W005")
    assert "10.0.0.7:11211, cache.internal:11211 are beyond loopback" in warning.msg
    assert "127.0.0.1" not in warning.msg
    many = [f"10.0.0.{i}:11211" for i in range(1, 6)]
    assert "and 2 more" in only(run(many), "mcpatterns.W005").msg


def test_w005_can_be_silenced_like_any_check():
    entry = {"BACKEND": CLUSTER_BACKEND, "LOCATION": ["10.0.0.7:11211"]}

    def check_output() -> str:
        out, err = io.StringIO(), io.StringIO()
        call_command("check", tags=[checks.Tags.caches], stdout=out, stderr=err)
        return out.getvalue() + err.getvalue()

    with override_settings(CACHES={"default": entry}):
        assert "(mcpatterns.W005)" in check_output()
        with override_settings(SILENCED_SYSTEM_CHECKS=["mcpatterns.W005"]):
            assert "mcpatterns.W005" not in check_output()


def test_w006_backend_without_the_app():
    entries = {
        "default": {"BACKEND": EMBEDDED_BACKEND},
        "other": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"},
    }
    with override_settings(CACHES=entries, INSTALLED_APPS=[]):
        warning = only(check_installed(None), "mcpatterns.W006")
    assert warning.obj == "CACHES['default']"
    assert "INSTALLED_APPS" in warning.msg
    assert "{% load mcpatterns %}" in warning.hint
    with override_settings(CACHES=entries):
        assert check_installed(None) == []


def test_w007_staff_only_status_page_without_auth():
    with override_settings(ROOT_URLCONF=__name__, DEBUG=False):
        warning = only(check_status_page(None), "mcpatterns.W007")
    assert warning.obj == "/status/"  # not /open-status/: its permission needs no users
    assert "'django.contrib.auth' in INSTALLED_APPS" in warning.msg


def test_w007_not_when_auth_is_there():
    with override_settings(
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_mcpatterns"],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
    ):
        assert check_status_page(None) == []
