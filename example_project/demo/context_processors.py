from typing import Any

from django.apps import apps
from django.conf import settings
from django.http import HttpRequest

from .models import Profile


def site(request: HttpRequest) -> dict[str, Any]:
    """What the base layout shows on every page."""
    return {
        "cache_backend": settings.CACHES["default"]["BACKEND"].rsplit(".", 1)[-1],
        "cache_servers": settings.MEMCACHED_SERVERS or "in-process",
        # Lazy: queried only when the sidebar's cached fragment is rendered, and then
        # read through the ORM cache (one multi-get while no profile changed).
        "directory": Profile.objects.only("id", "name", "city").cache(),
        # A callable: the template asks the cached count (1 request) when it renders it.
        "member_count": apps.get_app_config("demo").members.get,  # type: ignore[attr-defined]
    }
