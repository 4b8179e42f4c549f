"""Invalidate cache namespaces when model instances change.

::

    # models.py (or AppConfig.ready)
    from django_mcpatterns.receivers import invalidate_on_change

    invalidate_on_change(Comment, lambda comment: [("post", comment.post_id),
                                                   ("user", comment.author_id)])

The receiver runs on ``post_save`` and ``post_delete`` of the model and
invalidates once the transaction commits (``transaction.on_commit``): an
invalidation before the commit would let a concurrent reader cache the old,
still committed rows under the new version, and serve them until the next
change.  Outside a transaction it invalidates at once.

An invalidation that fails (memcached down, ``raise_errors`` or not) never
makes ``Model.save()`` or ``delete()`` fail: the data is committed by then, and
an exception would tell the caller the opposite.  Each failed target is logged
(ERROR on ``django_mcpatterns.receivers``) and sent as the
``invalidation_failed`` signal; the others are still invalidated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from django.core.cache import DEFAULT_CACHE_ALIAS
from django.db import models, transaction
from django.db.models.signals import post_delete, post_save

from .decorators import patterns_cache

__all__ = ["NamespaceReceiver", "invalidate_on_change"]

logger = logging.getLogger("django_mcpatterns.receivers")


class _Invalidates(Protocol):
    def invalidate(self) -> int: ...


Target = tuple[str | int, ...] | str | int | _Invalidates | None
"""What the ``namespace`` callable returns: parts (a tuple, or one str/int) of a
namespace of the cache, a namespace object (``cache.namespace(...).namespace(...)``
for nested ones), ``None`` for nothing, or a list of these."""


class NamespaceReceiver:
    """The receiver :func:`invalidate_on_change` connected; :meth:`disconnect` undoes it."""

    def __init__(
        self,
        model: type[models.Model],
        namespace: Callable[[Any], Target | Iterable[Target]],
        cache: str,
        robust: bool,
    ) -> None:
        self.model = model
        self.namespace = namespace
        self.cache = cache
        self.robust = robust

    def __call__(self, sender: Any, instance: Any, using: str | None = None, **kwargs: Any) -> None:
        # Resolved now, from the instance as saved; invalidated once committed.
        targets = _targets(self.namespace(instance))
        if targets:
            transaction.on_commit(lambda: self.invalidate(targets), using=using, robust=self.robust)

    def invalidate(self, targets: list[Target]) -> None:
        """Invalidate every target; one that fails is logged and signalled, never raised."""
        for target in targets:
            try:
                self._invalidate(target)
            except Exception as exc:
                self._failed(target, exc)

    def _invalidate(self, target: Target) -> None:
        cache = patterns_cache(self.cache)
        if isinstance(target, tuple):
            cache.invalidate_namespace(*target)
        elif isinstance(target, str | int):
            cache.invalidate_namespace(target)
        else:
            target.invalidate()  # type: ignore[union-attr]

    def _failed(self, target: Target, error: Exception) -> None:
        from . import signals

        logger.error(
            "could not invalidate namespace %r of cache %r after a change to %s: %s: %s; "
            "its cached values stay until they expire",
            target,
            self.cache,
            self.model.__name__,
            type(error).__name__,
            error,
        )
        signals.invalidation_failed.send_robust(
            sender=self.model, target=target, cache=self.cache, error=error
        )

    def connect(self) -> NamespaceReceiver:
        post_save.connect(self, sender=self.model, weak=False)
        post_delete.connect(self, sender=self.model, weak=False)
        return self

    def disconnect(self) -> None:
        post_save.disconnect(self, sender=self.model)
        post_delete.disconnect(self, sender=self.model)

    def __repr__(self) -> str:
        return f"<NamespaceReceiver {self.model.__name__} cache={self.cache!r}>"


def invalidate_on_change(
    model: type[models.Model],
    namespace: Callable[[Any], Target | Iterable[Target]],
    *,
    cache: str = DEFAULT_CACHE_ALIAS,
    robust: bool = False,
) -> NamespaceReceiver:
    """Invalidate ``namespace(instance)`` of ``cache`` whenever ``model`` is saved or deleted.

    ``namespace`` returns what to invalidate (see :data:`Target`).  The
    invalidation waits for the transaction to commit.  When it fails (the
    namespace's server is unreachable) it is logged and the
    ``invalidation_failed`` signal is sent: the save never fails for it.
    ``robust`` is accepted for compatibility and changes nothing any more.
    Return the connected receiver.
    """
    return NamespaceReceiver(model, namespace, cache, robust).connect()


def _targets(found: Target | Iterable[Target]) -> list[Target]:
    if found is None:
        return []
    if isinstance(found, tuple | str | int) or hasattr(found, "invalidate"):
        return [found]  # type: ignore[list-item]
    return [target for target in found if target is not None]
