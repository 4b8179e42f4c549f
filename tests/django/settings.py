"""Minimal Django settings for the test suite; caches are set per test."""

SECRET_KEY = "tests-only-not-secret"
USE_TZ = True
INSTALLED_APPS = ["django_mcpatterns"]
DATABASES: dict = {}
CACHES = {"default": {"BACKEND": "django_mcpatterns.backend.LocMemPatternsCache"}}
