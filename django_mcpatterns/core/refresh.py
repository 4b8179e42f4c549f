"""A bounded pool of threads for background refreshes (``StampedePolicy.runner``).

A ``ThreadPoolExecutor``'s queue has no bound: when refreshes are slower than
the stale reads that queue them (the database is struggling), jobs pile up and
each runs long after the lock it was given has lapsed.  :class:`RefreshRunner`
queues at most ``max_queue`` jobs and refuses the next one with
:class:`RefreshQueueFull` (the stampede then releases the lock, serves the stale
value and reports the drop).  Its threads start on first use and again in a
forked child, where the parent's threads do not exist.  ``after_job`` runs in
the worker thread after every job: the Django layer passes
``django.db.close_old_connections`` (:func:`django_mcpatterns.refresh.refresh_runner`),
since the core imports no framework.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

from .exceptions import ConfigurationError

__all__ = ["RefreshQueueFull", "RefreshRunner"]

logger = logging.getLogger("django_mcpatterns.stampede")

Job = Callable[[], object]


class RefreshQueueFull(queue.Full):
    """The runner's queue is full: the job was not queued."""


class RefreshRunner:
    """Run jobs on ``workers`` daemon threads from a queue of at most ``max_queue`` jobs.

    Call it with a zero-argument job (the ``runner`` protocol of
    :class:`~.stampede.StampedePolicy`); a full queue raises
    :class:`RefreshQueueFull`.  ``after_job`` runs in the worker thread after
    each job, whatever the job did; its errors are logged.
    """

    def __init__(
        self,
        workers: int = 2,
        max_queue: int = 100,
        *,
        after_job: Callable[[], object] | None = None,
        name: str = "mcpatterns-refresh",
    ) -> None:
        for option, value in (("workers", workers), ("max_queue", max_queue)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(
                    f"option {option!r} must be an int >= 1, not {value!r}", option=option
                )
        self.workers = workers
        self.max_queue = max_queue
        self.after_job = after_job
        self.name = name
        self._guard = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue(max_queue)
        self._threads: list[threading.Thread] = []
        self._pid = 0  # the process whose threads these are

    def __call__(self, job: Job) -> None:
        """Queue ``job``; raise :class:`RefreshQueueFull` when ``max_queue`` jobs wait."""
        self._ensure_started()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise RefreshQueueFull(
                f"{self.name}: {self.max_queue} refreshes are queued already"
            ) from None

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads once the jobs queued so far have run (blocks with ``wait``)."""
        with self._guard:
            threads, self._threads = self._threads, []
            self._pid = 0  # a later job starts new threads
            for _ in threads:
                self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _ensure_started(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        with self._guard:
            if self._pid == pid:
                return
            if self._pid:  # a forked child: the parent's threads and jobs are not ours
                self._queue = queue.Queue(self.max_queue)
            self._threads = [
                threading.Thread(target=self._work, name=f"{self.name}-{n}", daemon=True)
                for n in range(self.workers)
            ]
            for thread in self._threads:
                thread.start()
            self._pid = pid

    def _work(self) -> None:
        jobs = self._queue
        while (job := jobs.get()) is not None:
            try:
                job()
            except Exception:
                logger.exception("%s: a background job failed", self.name)
            finally:
                self._after_job()

    def _after_job(self) -> None:
        if self.after_job is None:
            return
        try:
            self.after_job()
        except Exception:
            logger.exception("%s: after_job failed", self.name)
