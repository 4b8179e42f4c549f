"""Settings of the example site.

The cache is the embedded ``LocMemPatternsCache`` unless ``MEMCACHED_SERVERS`` is
set, e.g. ``MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212,127.0.0.1:11213``:
then it is a ketama-routed memcached cluster.
"""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django_mcpatterns",
    "demo",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
]
ROOT_URLCONF = "example_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
WSGI_APPLICATION = "example_site.wsgi.application"
DATABASES: dict = {}
USE_TZ = True

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
