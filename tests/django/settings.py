"""Minimal Django settings for the test suite; caches are set per test."""

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
INSTALLED_APPS = ["django_mcpatterns"]
# SQLite in memory, for the model-signal tests (tests/django/test_namespaces_models.py);
# other tests never touch it.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django_mcpatterns.backend.LocMemPatternsCache"}}
