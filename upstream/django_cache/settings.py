"""Settings for Django's own cache tests (Django's ``tests/cache/``) run against our backends.

scripts/django_cache_tests.py puts Django's ``tests/`` folder of the installed release in
``DJANGO_TESTS``: its ``cache`` app (a model the tests cache) is installed from there.  The
backends under test are set per test class (test_backends.py), as Django's own suite does.
"""

import os
import sys

sys.path.insert(0, os.environ["DJANGO_TESTS"])

SECRET_KEY = "django-cache-tests-only"
USE_TZ = False  # as Django's tests/test_sqlite.py
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "cache"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}]
