"""Flask-Caching backends over a Store: the ketama Cluster and the embedded MemoryStore.

Flask-Caching's contract (cachelib's ``BaseCache``) differs from Django's, and
these backends keep it to the letter:

* timeout ``0`` never expires, ``None`` means ``CACHE_DEFAULT_TIMEOUT``, a
  negative one expires at once; ``timedelta`` is accepted;
* an invalid key (over 250 bytes once prefixed, whitespace, control
  characters) is a miss or ``False``, never an exception: keys often come from
  request data;
* ``set_many`` returns the keys that *were* stored, ``delete_many`` the keys
  that are gone afterwards (absent ones count as deleted);
* ``inc``/``dec`` start from 0 on a missing key and may go below 0;
* ``clear`` flushes every server (memcached has no per-prefix flush).

The pattern methods (:mod:`django_mcpatterns.patterns`) put sets, locks,
``get_or_compute`` and namespaces on the same object (``cache.cache``) through
the hooks ``_pattern_key`` and ``_pattern_expire``, with Flask-Caching's timeout
convention.  Unlike the cache API, the patterns raise
:class:`~django_mcpatterns.core.exceptions.InvalidKeyError` for an invalid key:
a lock or a set that silently does nothing is worse than an error.

The store, values and options are wired by :mod:`django_mcpatterns.binding`, as
for Django, with Flask-Caching's conventions where they differ: one embedded
store per backend instance (as ``SimpleCache``), errors naming the Flask
setting.  The class names follow Flask-Caching's (``MemcachedCache``); the
Django backends follow Django's (``PyMemcacheCache``):
``django_mcpatterns.backend.KetamaMemcacheCache``.
"""

from __future__ import annotations

import datetime
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flask import Flask
from flask_caching.backends.base import BaseCache

from ..binding import (
    ClusterBinding,
    Conventions,
    EmbeddedBinding,
    Setting,
    bind_cluster,
    bind_embedded,
)
from ..core import chance
from ..core.aio import AsyncCluster
from ..core.cluster import Cluster
from ..core.exceptions import (
    ConfigurationError,
    InvalidKeyError,
    NeedsMetaProtocolError,
    NonNumericValueError,
    ValueTooLargeError,
)
from ..core.keys import key_bytes, shorten
from ..core.locks import Backoff
from ..core.memory import AsyncMemoryStore, MemoryStore
from ..core.sets import SetOptions
from ..core.store import MAX_RELATIVE_EXPIRE, Store
from ..patterns import DEFAULT, PatternMethods
from ..patterns.observed import observe_event
from .signals import send_pattern_event, send_value_refused

__all__ = ["KetamaMemcachedCache", "LocMemPatternsCache", "PatternsCache", "memcached_exptime"]

logger = logging.getLogger("django_mcpatterns.flask")

Timeout = int | float | datetime.timedelta | None

# Flask-Caching's MemcachedCache default when CACHE_MEMCACHED_SERVERS is unset.
DEFAULT_SERVERS = ("127.0.0.1:11211",)
# Rounds of gets/cas before inc/dec gives up under contention ("None for backend errors"),
# spaced out so that a decrement is not starved by a stream of atomic increments.
CAS_ATTEMPTS = 32
CAS_BACKOFF = Backoff(initial=0.0005, maximum=0.02)

_MISSING = object()


def memcached_exptime(seconds: int, now: float) -> int:
    """Return memcached's exptime for a Flask-Caching timeout in whole seconds.

    ``0`` never expires in both conventions.  A negative timeout expires at
    once (memcached: any negative exptime).  Over 30 days memcached reads the
    exptime as a Unix time (protocol.txt, "Expiration times"), so long
    timeouts are sent as ``now + seconds``.
    """
    if seconds < 0:
        return -1
    if seconds > MAX_RELATIVE_EXPIRE:
        return int(now) + seconds
    return seconds


class PatternsCache(PatternMethods, BaseCache):
    """Flask-Caching's backend contract over a binding, with every pattern method.

    The base of both backends (for type hints and ``isinstance``); subclasses
    say which store.
    """

    def __init__(
        self,
        default_timeout: int | datetime.timedelta = 300,
        key_prefix: str | None = None,
        ignore_delete_many_errors: bool = False,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = chance.uniform,
        secret_key: str | bytes | None = None,
    ) -> None:
        super().__init__(
            # Flask-Caching annotates int; cachelib, which gets it, converts a timedelta.
            default_timeout=default_timeout,  # type: ignore[arg-type]
            ignore_delete_many_errors=ignore_delete_many_errors,
        )
        self.key_prefix = _checked_prefix(key_prefix)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._secret_key = secret_key

    def _conventions(self, **given: Any) -> Conventions:
        """Flask-Caching's conventions for this cache's binding (see :mod:`..binding`)."""
        return Conventions(
            # signed=True without a key: one derived from the app's SECRET_KEY.
            secrets=lambda: [self._secret_key],
            # Prefixes match the caller's key: after CACHE_KEY_PREFIX.
            key_scope=re.escape(self.key_prefix),
            on_value_refused=send_value_refused,
            refused=_setting_error,
            **given,
        )

    def _bound_set_options(self, store: Store) -> SetOptions:
        return self._set_options()

    # -- the patterns' hooks ----------------------------------------------------

    def _pattern_key(self, key: Any, version: int | None = None) -> str:
        """Return ``CACHE_KEY_PREFIX + key`` (``prefix + "<version>:" + key`` with a version).

        Raise :class:`InvalidKeyError` when memcached would refuse it.
        """
        if not isinstance(key, str):
            raise InvalidKeyError(f"Flask-Caching keys are str, not {type(key).__name__}")
        made = self.key_prefix + (key if version is None else f"{version}:{key}")
        if self.binding.hash_long_keys:
            made = shorten(made)  # OPTIONS["long_keys"] = "hash": a digest form under 250 bytes
        key_bytes(made)
        return made

    def _pattern_expire(self, timeout: Any = DEFAULT) -> int:
        """Return memcached's exptime for a Flask-Caching timeout (``None``: the default)."""
        return self._expire(None if timeout is DEFAULT else timeout)

    def _pattern_event(self, event: object) -> None:
        """Send stampede and lock events as blinker signals (:mod:`.signals`)."""
        observe_event(self, event)
        send_pattern_event(self, event)

    # -- Flask-Caching's API ----------------------------------------------------

    def get(self, key: str) -> Any:
        made = self._made(key)
        return None if made is None else self.binding.near_values.get(made)

    def has(self, key: str) -> bool:
        made = self._made(key)
        # A default sentinel tells a stored None from a miss, without the
        # ``append(key, "")`` trick of cachelib, which would change the item's
        # CAS token under concurrent sets and locks.
        return made is not None and self.binding.near_values.get(made, _MISSING) is not _MISSING

    def get_many(self, *keys: str) -> list[Any]:
        found = self.get_dict(*keys)
        return [found[key] for key in keys]

    def get_dict(self, *keys: str) -> dict[str, Any]:
        made = self._made_map(keys)
        hits = self.binding.near_values.get_many(list(made)) if made else {}
        found = {key: hits.get(made_key) for made_key, key in made.items()}
        return {key: found.get(key) for key in keys}

    def set(self, key: str, value: Any, timeout: Timeout = None) -> bool:
        return self._write("set", key, value, timeout)

    def add(self, key: str, value: Any, timeout: Timeout = None) -> bool:
        return self._write("add", key, value, timeout)

    def set_many(self, mapping: Mapping[str, Any], timeout: Timeout = None) -> list[Any]:
        """Store every value; return the keys that were stored (Flask-Caching's convention)."""
        made = self._made_map(mapping, write=True)
        expire = self._expire(timeout)
        failed = set(
            self.binding.near_values.set_many({m: mapping[k] for m, k in made.items()}, expire)
        )
        return [key for made_key, key in made.items() if made_key not in failed]

    def delete(self, key: str) -> bool:
        made = self._made(key)
        return made is not None and self.binding.near_values.delete(made)

    def delete_many(self, *keys: str) -> list[Any]:
        """Delete the keys; return those absent afterwards, as cachelib's memcached backend does.

        One pipelined delete and one pipelined read tell which keys are still
        there (e.g. written again meanwhile); with ``CACHE_IGNORE_ERRORS``
        false those raise ``RuntimeError``.
        """
        made = self._made_map(keys)
        if not made:
            return []
        self.binding.near_values.delete_many(list(made))
        remaining = self.values.get_many(list(made))
        failed = [key for made_key, key in made.items() if made_key in remaining]
        if failed and not self.ignore_delete_many_errors:
            raise RuntimeError(f"Failed to delete keys: {failed}")
        return [key for made_key, key in made.items() if made_key not in remaining]

    def bump(self, key: str) -> bool:
        """Refresh ``key``'s place in memcached's LRU without fetching it or changing its TTL.

        Return whether it was there (memcached's "touching keys with add");
        an invalid key is False, as a miss.
        """
        made = self._made(key)
        return made is not None and self.values.bump(made)

    async def abump(self, key: str) -> bool:
        """:meth:`bump` for asyncio, on :attr:`avalues`."""
        made = self._made(key)
        return made is not None and await self.avalues.bump(made)

    def clear(self) -> bool:
        """Flush the whole store: every key, whatever its prefix (memcached's ``flush_all``)."""
        return self.binding.near_values.flush_all()

    def inc(self, key: str, delta: int = 1) -> int | None:
        """Add ``delta`` atomically; a missing key starts from 0.  ``None`` on a backend error."""
        return self._add_delta(key, delta)

    def dec(self, key: str, delta: int = 1) -> int | None:
        """Subtract ``delta`` atomically; a missing key starts from 0 and may go below 0."""
        return self._add_delta(key, -delta)

    # -- shared steps -------------------------------------------------------------

    def _made(self, key: Any, *, write: bool = False) -> str | None:
        """The full key, or None when memcached would refuse it (a miss, not an error)."""
        try:
            return self._pattern_key(key)
        except InvalidKeyError as exc:
            if write:
                # Such a key can never be cached; say so rather than miss forever in silence.
                logger.warning("not cached: %s", exc)
            return None

    def _made_map(self, keys: Iterable[Any], *, write: bool = False) -> dict[str, Any]:
        """Full key → key as given, for the valid keys only."""
        made = ((self._made(key, write=write), key) for key in keys)
        return {made_key: key for made_key, key in made if made_key is not None}

    def _expire(self, timeout: Timeout) -> int:
        # cachelib's _normalize_timeout: None → default_timeout, timedelta → seconds.
        # cachelib's annotation leaves out the float timeouts it still rounds up (deprecated).
        seconds = self._normalize_timeout(timeout)  # type: ignore[arg-type]
        return memcached_exptime(seconds, self._clock())

    def _write(self, command: str, key: str, value: Any, timeout: Timeout) -> bool:
        made = self._made(key, write=True)
        if made is None:
            return False
        expire = self._expire(timeout)
        try:
            return bool(getattr(self.binding.near_values, command)(made, value, expire))
        except ValueTooLargeError:
            # memcached removes the old item of a set over the limit, so no stale
            # value outlives the failed write (store.py).
            logger.warning("not cached: the value of %r is over the item size limit", made)
            return False

    def _add_delta(self, key: str, delta: int) -> int | None:
        made = self._made(key, write=True)
        if made is None:
            return None
        if delta >= 0:
            # memcached's incr is atomic and keeps the item's TTL.  It answers
            # None for a missing key and refuses a negative count (stored as
            # "-3", which it does not parse): both go the gets/cas way.
            try:
                number = self.binding.near_values.incr(made, delta)
            except NonNumericValueError:
                number = None
            if number is not None:
                return number
        # memcached's decr stops at 0 where Flask-Caching goes below it, so
        # decrements and new counters are a compare-and-swap on the value.
        return self._swap_delta(made, delta)

    def _swap_delta(self, made: str, delta: int) -> int | None:
        store = self.binding.near_values
        for attempt in range(CAS_ATTEMPTS):
            value, token, left = store.gets_ttl(made)
            if token is None:
                if store.add(made, delta, self._expire(None)):
                    return delta
            elif not isinstance(value, int | float):
                raise NonNumericValueError(
                    f"cannot increment or decrement the non-numeric value of {made!r}"
                )
            else:
                expire = self._kept_expire(made, left)
                if expire is not None and store.cas(made, value + delta, token, expire):
                    return value + delta  # type: ignore[return-value]  # a float counter stays float
            self._sleep(CAS_BACKOFF.delay(attempt, self._rng))  # someone else wrote first
        return None

    def _kept_expire(self, made: str, left: int | None) -> int | None:
        """The exptime that keeps the item's TTL through a ``cas``; None when it is gone.

        ``cas`` sets a new TTL where ``incr`` keeps the old one: ``left`` was
        read with the value (meta's ``mg v c t f``), or, where the protocol
        cannot say it there, the store is asked (``ttl``, one request; an item
        replaced in between fails the ``cas`` and is read again).  In text mode
        (``"protocol": "text"``: no TTL read) the rewrite gets the cache's
        default timeout.
        """
        if left is None:
            try:
                left = self.values.ttl(made)
            except NeedsMetaProtocolError:
                return self._expire(None)
        if left is None:
            return None
        return 0 if left < 0 else memcached_exptime(max(left, 1), self._clock())


class KetamaMemcachedCache(PatternsCache):
    """A memcached cluster with ketama routing, for Flask-Caching's ``CACHE_TYPE``.

    ``servers`` (``CACHE_MEMCACHED_SERVERS``) are ``host:port[:weight]`` specs,
    as a list or one string separated by ``;`` or ``,``.  ``options``
    (``CACHE_OPTIONS``) are :class:`~django_mcpatterns.core.options.ClusterOptions`
    (``ketama``, ``failover``, timeouts...) and the socket options (``no_delay``...).
    Every backend of the process naming the same servers and options shares
    one :class:`Cluster`: its connection pools and its servers' health.
    ``secret_key`` (the factory passes the app's ``SECRET_KEY``) is what a
    signing key is derived from for ``signed=True`` without one.
    """

    def __init__(
        self,
        servers: str | Iterable[str] | None = None,
        default_timeout: int | datetime.timedelta = 300,
        key_prefix: str | None = None,
        ignore_delete_many_errors: bool = False,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = chance.uniform,
        secret_key: str | bytes | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            default_timeout,
            key_prefix,
            ignore_delete_many_errors,
            clock=clock,
            sleep=sleep,
            rng=rng,
            secret_key=secret_key,
        )
        self.binding = bind_cluster(
            DEFAULT_SERVERS if servers is None else servers,
            options,
            self._conventions(),
            set_options=self._bound_set_options,
        )

    @classmethod
    def factory(
        cls, app: Flask, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> KetamaMemcachedCache:
        """Build the backend from Flask-Caching's config (``kwargs`` holds ``CACHE_OPTIONS``)."""
        _refuse_cache_args(args)
        return cls(
            config["CACHE_MEMCACHED_SERVERS"],
            key_prefix=config["CACHE_KEY_PREFIX"],
            secret_key=config.get("SECRET_KEY"),
            **kwargs,
        )

    binding: ClusterBinding

    @property
    def servers(self) -> list[str]:
        """The servers' nodes (``host:port``), in the order configured."""
        return [server.node for server in self.binding.servers]

    @property
    def store(self) -> Cluster:
        return self.binding.store

    @property
    def astore(self) -> AsyncCluster:
        """The Cluster's asyncio twin (same servers, node health and serde; its own connections)."""
        return self.binding.async_store


class LocMemPatternsCache(PatternsCache):
    """The embedded backend: memcached's semantics in-process, no server needed.

    Each backend instance (one per Flask app and ``Cache``) owns its store, as
    Flask-Caching's ``SimpleCache`` does.  ``CACHE_OPTIONS``: ``max_bytes``
    (memory before least-recently-used items are evicted, 64 MiB),
    ``max_item_size`` (1 MiB, memcached's ``-I``), and the cluster's
    ``serializer`` and signing options, so values behave as they will on
    memcached.
    """

    def __init__(
        self,
        default_timeout: int | datetime.timedelta = 300,
        key_prefix: str | None = None,
        ignore_delete_many_errors: bool = False,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = chance.uniform,
        secret_key: str | bytes | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            default_timeout,
            key_prefix,
            ignore_delete_many_errors,
            clock=clock,
            sleep=sleep,
            rng=rng,
            secret_key=secret_key,
        )
        # Checked, then set aside (as the Django backend does): no wire to measure.
        self.binding = bind_embedded(
            "", options, self._conventions(clock=clock), set_options=self._bound_set_options
        )

    @classmethod
    def factory(
        cls, app: Flask, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> LocMemPatternsCache:
        _refuse_cache_args(args)
        return cls(
            key_prefix=config["CACHE_KEY_PREFIX"], secret_key=config.get("SECRET_KEY"), **kwargs
        )

    binding: EmbeddedBinding

    @property
    def store(self) -> MemoryStore:
        return self.binding.store

    @property
    def astore(self) -> AsyncMemoryStore:
        return self.binding.async_store


# -- configuration -------------------------------------------------------------------


SETTINGS: dict[Setting, str] = {"servers": "CACHE_MEMCACHED_SERVERS", "options": "CACHE_OPTIONS"}


def _setting_error(setting: Setting, exc: ConfigurationError) -> ConfigurationError:
    """The same error, naming the Flask setting it came from."""
    name = SETTINGS[setting]
    return ConfigurationError(f"{name}: {exc}", option=exc.option, choices=exc.choices)


def _checked_prefix(prefix: str | None) -> str:
    if prefix is None:
        return ""
    if not isinstance(prefix, str):
        raise ConfigurationError(
            f"CACHE_KEY_PREFIX must be a string, not {type(prefix).__name__}",
            option="CACHE_KEY_PREFIX",
        )
    if prefix:
        # A prefix memcached refuses would make every key a silent miss.
        try:
            key_bytes(prefix)
        except InvalidKeyError as exc:
            raise ConfigurationError(f"CACHE_KEY_PREFIX: {exc}", option="CACHE_KEY_PREFIX") from exc
    return prefix


def _refuse_cache_args(args: list[Any]) -> None:
    if args:
        raise ConfigurationError(
            "CACHE_ARGS is not used by django-mcpatterns backends; "
            "set CACHE_MEMCACHED_SERVERS and CACHE_OPTIONS instead",
            option="CACHE_ARGS",
        )
