"""Settings of the example site.

The cache is the embedded ``LocMemPatternsCache`` unless ``MEMCACHED_SERVERS`` is
set, e.g. ``MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212,127.0.0.1:11213``:
then it is a ketama-routed memcached cluster.  The database is the SQLite file
``example_project/db.sqlite3`` (``EXAMPLE_DATABASE`` names another one).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django_mcpatterns",
    "django_mcpatterns.orm",  # querysets cached on memcached with .cache() (docs/orm.md)
    "demo",
]
# The ORM cache: results in the default cache, 5 minutes at most; invalidated on every write.
MCPATTERNS_ORM = {"cache": "default", "timeout": 300}
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    # A lock whose memcached server cannot be reached answers 503 with Retry-After, not 500.
    "django_mcpatterns.middleware.CacheUnavailableMiddleware",
]
ROOT_URLCONF = "example_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "demo.context_processors.site",
            ]
        },
    }
]
WSGI_APPLICATION = "example_site.wsgi.application"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DATABASE") or BASE_DIR / "db.sqlite3",
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# How slow the demo's deliberately expensive work is, in seconds: the front
# page's report, and a leaderboard rebuild (long enough to click it twice).
EXAMPLE_REPORT_SECONDS = 0.5
EXAMPLE_REBUILD_SECONDS = 2.0

MEMCACHED_SERVERS = os.environ.get("MEMCACHED_SERVERS", "").strip()
if MEMCACHED_SERVERS:
    CACHES = {
        "default": {
            "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
            "LOCATION": MEMCACHED_SERVERS,
            "KEY_PREFIX": "example",
            "OPTIONS": {"ketama": "libmemcached", "failover": "miss"},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django_mcpatterns.backend.LocMemPatternsCache",
            "LOCATION": "example",
            "KEY_PREFIX": "example",
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_mcpatterns": {"handlers": ["console"], "level": "INFO"}},
}
