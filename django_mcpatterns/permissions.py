"""Who may see the status page: the ready-made permissions and the view that applies one.

The status view (:mod:`.views`) and the system check that warns when its default
permission cannot let anyone in (``mcpatterns.W007``, :mod:`.checks`) both need them;
here they import neither module.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.views import View

__all__ = ["PermissionView", "debug_or_staff", "is_staff"]


def is_staff(request: HttpRequest) -> bool:
    """Let in active staff users (needs ``django.contrib.auth`` and its middleware)."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def debug_or_staff(request: HttpRequest) -> bool:
    """Let anyone in while ``DEBUG`` is on (development), else staff users only."""
    return bool(settings.DEBUG) or is_staff(request)


class PermissionView(View):
    """A view for the users ``permission`` lets in (staff users by default)."""

    permission: Callable[[HttpRequest], bool] = staticmethod(is_staff)

    def check_permission(self, request: HttpRequest) -> None:
        """Raise :class:`PermissionDenied` unless ``permission`` lets ``request`` in."""
        if not self.permission(request):
            raise PermissionDenied("the cache status page is for staff users")
