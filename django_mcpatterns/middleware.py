"""``CacheUnavailableMiddleware``: a memcached outage answers 503, never 500.

::

    MIDDLEWARE = [..., "django_mcpatterns.middleware.CacheUnavailableMiddleware"]

A :class:`~django_mcpatterns.core.exceptions.NodeUnavailableError` escaping a
view (``cache.lock(...)`` raises :class:`~django_mcpatterns.core.exceptions.LockUnavailableError`
when its server cannot be reached; ``OPTIONS["on_outage"] = "raise"`` or
``raise_errors`` make other patterns raise it too) becomes a 503 response with
a ``Retry-After`` header (``settings.MCPATTERNS_RETRY_AFTER`` seconds, 1 by
default), logged as a warning.  Any other exception is left to Django.

Sync and async: the middleware is both, so Django runs it in the request's
own mode (no thread hop of its own).  Django calls ``process_exception`` of
every middleware for an exception from a view or from rendering its
template response; list this one anywhere in ``MIDDLEWARE``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from .core.exceptions import NodeUnavailableError

__all__ = ["CacheUnavailableMiddleware", "unavailable_response"]

logger = logging.getLogger("django_mcpatterns.middleware")

DEFAULT_RETRY_AFTER = 1


def unavailable_response(error: NodeUnavailableError) -> HttpResponse:
    """The 503 for ``error``, with ``Retry-After`` (``settings.MCPATTERNS_RETRY_AFTER``)."""
    retry_after = int(getattr(settings, "MCPATTERNS_RETRY_AFTER", DEFAULT_RETRY_AFTER))
    response = HttpResponse(
        "Service temporarily unavailable: please retry shortly.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(max(retry_after, 0))
    return response


class CacheUnavailableMiddleware:
    """Turn a :class:`NodeUnavailableError` escaping a view into a 503 (see the module)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response: Awaitable[HttpResponse] = self.get_response(request)
        return await response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, NodeUnavailableError):
            return None
        logger.warning(
            "%s %s answered 503: %s", request.method, request.path, exception, exc_info=False
        )
        return unavailable_response(exception)
