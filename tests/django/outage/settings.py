"""The example site's settings (with its 503 middleware), and the drill's pages."""

from example_site.settings import *  # noqa: F403
from example_site.settings import DATABASES, MIDDLEWARE

assert "django_mcpatterns.middleware.CacheUnavailableMiddleware" in MIDDLEWARE
ROOT_URLCONF = "tests.django.outage.urls"
DEBUG = False
# Four workers write to one SQLite file: wait for its lock rather than fail (not the cache's).
DATABASES = {"default": {**DATABASES["default"], "OPTIONS": {"timeout": 30}}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"pid": {"format": "%(process)d %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "pid"}},
    "loggers": {"django_mcpatterns": {"handlers": ["console"], "level": "WARNING"}},
}
