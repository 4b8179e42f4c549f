"""Minimal Django settings for the test suite; caches are set per test."""

import os
import tempfile
from typing import Any

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
# tests.orm.shop: the ORM cache tests' models (tests/orm); the ORM app itself is
# installed by those tests only (django_mcpatterns.orm.testing.installed).
INSTALLED_APPS = ["django_mcpatterns", "tests.orm.shop"]
# SQLite in memory, for the model-signal tests (tests/django/test_namespaces_models.py);
# other tests never touch it.
DATABASES: dict[str, dict[str, Any]] = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
}
# A file database for tests that check worker threads close their connections
# (tests/django/test_refresh.py): SQLite never closes a connection to an in-memory one.
_REFRESH_DB = os.path.join(tempfile.gettempdir(), f"mcpatterns-refresh-{os.getpid()}.sqlite3")
DATABASES["refresh"] = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": _REFRESH_DB,
    "TEST": {"NAME": _REFRESH_DB, "DEPENDENCIES": []},
}
CACHES = {"default": {"BACKEND": "django_mcpatterns.backend.LocMemPatternsCache"}}
