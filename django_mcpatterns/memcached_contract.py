"""Django's memcached cache contract, kept by this project without Django's memcached backend.

Django's ``BaseMemcachedCache`` wants a client library (``_lib``, ``_class``,
``LibraryValueNotFoundException``...); our backends bring a
:class:`~django_mcpatterns.binding.Binding` instead, so they subclass ``BaseCache``
and keep the conventions of Django's memcached backends here, in the open:

* keys: ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` (``BaseCache.make_key``),
  then (``OPTIONS["long_keys"] = "hash"``) the digest form of a key over 250
  bytes, then validation with Django's own messages for what memcached refuses;
* timeouts: ``None`` never expires, ``0`` expires at once, over 30 days is sent
  as a Unix time (memcached's rule, ``get_backend_timeout``);
* answers: a value over the item size limit is not stored (logged, ``False``),
  a failed ``set`` deletes the old value, ``incr`` of a missing key is a
  ``ValueError``, ``set_many`` returns the keys that failed, ``get_many`` the
  keys as given.

The cache API itself (``get``, ``aget``, ``set``, ``aset``...) is written once, in
``_async/cache.py``, on top of :class:`MemcachedContract`; ``_sync/cache.py`` is
generated from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.cache.backends.base import (
    DEFAULT_TIMEOUT,
    BaseCache,
    InvalidCacheKey,
    default_key_func,
    memcache_key_warnings,
)

from .core.exceptions import InvalidKeyError
from .core.keys import MAX_KEY_LENGTH, key_bytes, shorten
from .core.store import MAX_RELATIVE_EXPIRE, AsyncStore, Store
from .patterns import DEFAULT, PatternHost

__all__ = [
    "MISSING",
    "MemcachedContract",
    "as_given",
    "counted",
    "made_values",
    "too_large",
]

logger = logging.getLogger("django_mcpatterns.backend")

MADE_KEYS = 1024  # keys made and kept per cache and generation (two: about 200 KB)

KeysMade = tuple[Any, Any, Any, dict[str, str], dict[str, str], "str | None"]
"""``MemcachedContract._keys_made``: prefix, version, key function, keys made, the
generation before, head."""

MISSING: Any = object()
"""A ``default`` no stored value is: what tells a stored ``None`` from a miss."""


class MemcachedContract(PatternHost, BaseCache):
    """Keys, timeouts and answers as Django's memcached backends have them.

    ``location`` is the ``LOCATION`` of the ``CACHES`` entry and ``params`` the
    rest of it, as Django passes them to every cache backend.
    """

    # Whether this class makes and validates keys as this one does (a subclass may override
    # make_key or validate_key, as Django's docs suggest): then the hot path inlines them.
    _own_keys = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._own_keys = (
            cls.make_key is BaseCache.make_key
            and cls.validate_key is MemcachedContract.validate_key
        )

    def __init__(self, location: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(params)
        self._location = location
        self._options: Mapping[str, Any] = params.get("OPTIONS") or {}
        self._hash_long_keys = self._options.get("long_keys") == "hash"
        # Keys made (make_and_validate_key), valid while the prefix, the version and the
        # key function they were made under stay: those three, the keys made, those of the
        # generation before, and the head they start with (``"prefix:version:"``; None when
        # keys are not made here: not a valid key's head, or not Django's way of making).
        self._keys_made: KeysMade = (None, None, None, {}, {}, None)
        # The binding's near_values and async_near_values, kept by get and set on first use
        # (an instance attribute is read faster than a cached_property).
        self._sync_reads: Store | None = None
        self._async_reads: AsyncStore | None = None

    def make_and_validate_key(self, key: Any, version: Any = None) -> str:
        """Django's key (``KEY_PREFIX``, version, ``KEY_FUNCTION``), validated.

        With ``OPTIONS["long_keys"] = "hash"``, a key over 250 bytes becomes its
        digest form first (:func:`~django_mcpatterns.core.keys.shorten`).
        """
        if version is None and type(key) is str:
            # A key used again while the prefix, version and key function stay is the
            # same string: made once (a near-cache hit is mostly this lookup).
            state = self._keys_made
            if (
                state[0] is not self.key_prefix
                or state[1] is not self.version
                or state[2] is not self.key_func
            ):
                state = self._keys_made = self._keys_state()
            made = state[3].get(key)
            if made is not None:
                return made
            head = state[5]
            if head is not None:
                # Django's make_key with its key function, then the check a valid key
                # passes.  Two generations of MADE_KEYS: a key read again while the newer
                # fills is kept in it, so the hot ones stay made.
                made = state[4].get(key)
                if made is None:
                    made = head + key
                    if self._hash_long_keys:
                        made = shorten(made)
                        valid = made.isascii() and made.isprintable() and " " not in made
                    else:  # the head passed the check: the key's characters are what is left
                        valid = key.isascii() and key.isprintable() and " " not in key
                    if not (valid and len(made) <= MAX_KEY_LENGTH):  # key_bytes's test
                        made = None
                if made is not None:
                    made_keys = state[3]
                    if len(made_keys) >= MADE_KEYS:  # a new generation; the oldest is dropped
                        made_keys = {}
                        self._keys_made = (*state[:3], made_keys, state[3], head)
                    made_keys[key] = made
                    return made
        made = self.make_key(key, version=version)
        if self._hash_long_keys:
            made = shorten(made)
        self.validate_key(made)
        return made

    def _keys_state(self) -> KeysMade:
        """A new ``_keys_made`` for the current prefix, version and key function."""
        prefix, version, key_func = self.key_prefix, self.version, self.key_func
        head: str | None = None
        if self._own_keys and key_func is default_key_func:  # Django's make_key, our check
            head = "%s:%s:" % (prefix, version)  # noqa: UP031  # Django's: str() of each
            if not (head.isascii() and head.isprintable() and " " not in head):
                head = None  # every key made with it fails the check: Django's path
        return (prefix, version, key_func, {}, {}, head)

    def validate_key(self, key: str) -> None:
        # Ours is the stricter check (memcached's 250 limit is on the UTF-8
        # bytes, where Django counts characters) and the cheaper one, run per
        # key on every call; a key it refuses gets Django's own message first,
        # word for word that of its memcached backends.
        try:
            key_bytes(key)
        except InvalidKeyError as exc:
            for warning in memcache_key_warnings(key):
                raise InvalidCacheKey(warning) from exc
            raise InvalidCacheKey(str(exc)) from exc

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> int:
        """memcached's exptime for a Django timeout (Django's memcached backends' rule).

        ``None`` never expires (0); ``0`` expires at once (memcached: a negative
        exptime); over 30 days memcached reads the exptime as a Unix time, so
        long timeouts are sent as ``now + timeout``.
        """
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return 0
        if int(timeout) == 0:
            timeout = -1
        if timeout > MAX_RELATIVE_EXPIRE:
            timeout += int(time.time())
        return int(timeout)

    # -- the pattern methods' hooks --

    def _pattern_key(self, key: Any, version: int | None = None) -> str:
        return self.make_and_validate_key(key, version)

    def _pattern_expire(self, timeout: Any = DEFAULT) -> int:
        return self.get_backend_timeout(DEFAULT_TIMEOUT if timeout is DEFAULT else timeout)

    # -- what the sync and async forms of the cache API share --

    def _write_args(self, key: Any, timeout: Any, version: Any) -> tuple[str, int]:
        return self.make_and_validate_key(key, version), self.get_backend_timeout(timeout)

    def _key_map(self, keys: Iterable[Any], version: Any) -> dict[str, Any]:
        """The made key of each key as given (validated before any I/O)."""
        return {self.make_and_validate_key(key, version): key for key in keys}


def too_large(key: str) -> bool:
    """A write of a value over memcached's item size limit answers False (logged), as Django's."""
    logger.warning("value for cache key %r is over the item size limit", key)
    return False


def as_given(found: Mapping[Any, Any], key_map: Mapping[Any, Any]) -> dict[Any, Any]:
    """``found`` (keyed by made keys) keyed by the keys as the caller gave them."""
    return {key_map[k]: v for k, v in found.items()}


def made_values(data: Mapping[Any, Any], key_map: Mapping[str, Any]) -> dict[str, Any]:
    return {made: data[key] for made, key in key_map.items()}


def counted(key: str, value: int | None) -> int:
    """``incr``'s answer; a missing key is Django's ValueError."""
    if value is None:
        raise ValueError(f"Key '{key}' not found")
    return value
