"""The patterns' methods on cache objects, shared by the Django and Flask backends.

Each pattern's algorithm lives in :mod:`django_mcpatterns.core` and knows nothing
of frameworks.  The methods here put it on a cache object with the public names
of ``design.md`` (``sadd``, ``lock``, ``get_or_compute``, ``namespace``...): thin
typed delegates to the pattern objects of the cache's
:class:`~django_mcpatterns.binding.Binding`, adapting keys and timeouts through
the hooks of :class:`~.host.PatternHost`, which both backends subclass.

Every method has an asyncio form with Django's a-prefix (``asadd``,
``aget_or_compute``...).  Each pair is written once, as the asyncio source
(``_async_sets.py``, ``_async_stampede.py``, ``_async_namespaces.py``,
``_async_limits.py``), and its sync form is generated beside it
(``_sync_*.py``, ``scripts/generate_sync.py``).  :class:`PatternMethods` is all of
them, each call observed by instrumentation (:mod:`.observed`).

The package imports neither Django nor Flask.
"""

from __future__ import annotations

from .host import DEFAULT, PatternHost
from .limits import LimitsMixin
from .locks import LocksMixin
from .namespaces import NamespacesMixin
from .observed import observe_patterns
from .sets import SetsMixin
from .stampede import StampedeMixin

__all__ = ["DEFAULT", "PATTERN_MIXINS", "PatternHost", "PatternMethods"]

PATTERN_MIXINS = (SetsMixin, LocksMixin, StampedeMixin, NamespacesMixin, LimitsMixin)


@observe_patterns(*PATTERN_MIXINS)
class PatternMethods(SetsMixin, LocksMixin, StampedeMixin, NamespacesMixin, LimitsMixin):
    """Every pattern method, sync and async, for a cache backend to inherit."""
