"""Background refreshes for Django projects: a bounded runner that closes database connections.

``StampedePolicy(runner=refresh_runner())`` recomputes stale values on a few
worker threads.  A computation that queries the database opens a connection in
the worker thread; Django closes request threads' connections through the
``request_finished`` signal, which a worker never sends, so the runner calls
``django.db.close_old_connections`` after every job (``CONN_MAX_AGE`` is
honoured, as for requests).
"""

from __future__ import annotations

from django.db import close_old_connections

from .core.refresh import RefreshRunner

__all__ = ["refresh_runner"]


def refresh_runner(workers: int = 2, max_queue: int = 100) -> RefreshRunner:
    """Return a :class:`~.core.refresh.RefreshRunner` whose workers close stale DB connections.

    At most ``max_queue`` refreshes wait; one more is dropped (the stale value
    is served and ``refresh_dropped`` sent).
    """
    return RefreshRunner(workers, max_queue, after_job=close_old_connections)
