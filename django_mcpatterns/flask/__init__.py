"""Flask integration: Flask-Caching backends over the ketama Cluster and the embedded store.

::

    CACHE_TYPE = "django_mcpatterns.flask.KetamaMemcachedCache"   # a memcached cluster
    CACHE_TYPE = "django_mcpatterns.flask.LocMemPatternsCache"    # in-process, no server

Both keep Flask-Caching's backend contract (which is not Django's: timeout 0
never expires, ``None`` is the default timeout, ``set_many`` returns the keys
stored, an invalid key is a miss) and carry the patterns on ``cache.cache``.
:func:`stampede_guard` caches views with stampede protection, :func:`ratelimit`
limits them, :func:`handle_cache_unavailable` answers a memcached outage with a
503 instead of a 500; ``warm_command`` is ``flask mcpatterns-warm`` (a ring
change's warm-up: ``app.cli.add_command(warm_command)``); the blinker signals of
the patterns are in :mod:`django_mcpatterns.flask.signals`.

Importing this package needs Flask-Caching but never Django or its settings.
"""

from .backend import KetamaMemcachedCache, LocMemPatternsCache
from .cli import warm_command
from .decorators import CachedPage, cacheable, stampede_guard
from .errors import handle_cache_unavailable
from .limiting import ratelimit

__all__ = [
    "CachedPage",
    "KetamaMemcachedCache",
    "LocMemPatternsCache",
    "cacheable",
    "handle_cache_unavailable",
    "ratelimit",
    "stampede_guard",
    "warm_command",
]
