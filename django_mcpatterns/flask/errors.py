"""``handle_cache_unavailable(app)``: a memcached outage answers 503 in Flask, never 500.

::

    from django_mcpatterns.flask import handle_cache_unavailable
    handle_cache_unavailable(app)

Registers an error handler for
:class:`~django_mcpatterns.core.exceptions.NodeUnavailableError` (and so
:class:`~django_mcpatterns.core.exceptions.LockUnavailableError`, which
``cache.cache.lock(...)`` raises when its server cannot be reached): a 503 with
a ``Retry-After`` header (``app.config["MCPATTERNS_RETRY_AFTER"]`` seconds, 1
by default), logged as a warning.  The counterpart of Django's
``django_mcpatterns.middleware.CacheUnavailableMiddleware``; works for sync and
async views alike.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, current_app, request

from ..core.exceptions import NodeUnavailableError

__all__ = ["handle_cache_unavailable"]

logger = logging.getLogger("django_mcpatterns.flask")

DEFAULT_RETRY_AFTER = 1


def _unavailable(error: NodeUnavailableError) -> Response:
    retry_after = int(current_app.config.get("MCPATTERNS_RETRY_AFTER", DEFAULT_RETRY_AFTER))
    logger.warning("%s %s answered 503: %s", request.method, request.path, error)
    response = Response(
        "Service temporarily unavailable: please retry shortly.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response.headers["Retry-After"] = str(max(retry_after, 0))
    return response


def handle_cache_unavailable(app: Flask) -> Flask:
    """Answer a :class:`NodeUnavailableError` escaping a view of ``app`` with a 503."""
    handler: Any = _unavailable
    app.register_error_handler(NodeUnavailableError, handler)
    return app
