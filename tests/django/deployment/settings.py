"""The example site's settings plus the deployment drill app (on ``MEMCACHED_SERVERS``)."""

from example_site.settings import *  # noqa: F403
from example_site.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.django.deployment.apps.DeploymentDrillConfig"]
ROOT_URLCONF = "tests.django.deployment.urls"
DEBUG = False
LOGGING = {"version": 1, "disable_existing_loggers": False}
