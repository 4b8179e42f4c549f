"""The embedded caches' options, and the stores shared by name across a process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import ConfigurationError
from ..keys import LONG_KEYS
from ..outages import ON_OUTAGE
from ..registry import Registry
from ..values.layout import LARGE_VALUES
from ..values.refusals import ValueRefused
from ..values.serde import SerdeOptions
from .store import MemoryStore

__all__ = [
    "EMBEDDED_OPTIONS",
    "MEMORY_OPTIONS",
    "memory_options",
    "reset_shared_memory_stores",
    "shared_memory_store",
]

# What an embedded cache's OPTIONS may hold: the store's sizes, and how values are encoded.
MEMORY_OPTIONS = ("max_bytes", "max_item_size")
EMBEDDED_OPTIONS = (
    *MEMORY_OPTIONS,
    *SerdeOptions.NAMES,
    "long_keys",
    "large_values",
    "on_outage",  # accepted (a configuration shared with production): nothing here fails
)


def memory_options(options: Mapping[str, Any]) -> dict[str, int]:
    """Return the :class:`MemoryStore` sizes among an embedded cache's ``options``, validated.

    The Django and Flask embedded backends take :data:`EMBEDDED_OPTIONS`; any
    other name, a size that is not a positive integer, or sizes memcached
    would refuse for ``-I`` and ``-m`` raise :class:`ConfigurationError`
    naming the option.
    """
    unknown = sorted(set(options) - set(EMBEDDED_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown option {unknown[0]!r}; valid options: "
            + ", ".join(repr(o) for o in EMBEDDED_OPTIONS),
            option=unknown[0],
            choices=EMBEDDED_OPTIONS,
        )
    checked = (("long_keys", LONG_KEYS), ("large_values", LARGE_VALUES), ("on_outage", ON_OUTAGE))
    for name, choices in checked:
        if options.get(name, choices[0]) not in choices:
            raise ConfigurationError(
                f"invalid value {options[name]!r} for option {name!r}; valid choices: "
                + ", ".join(repr(c) for c in choices),
                option=name,
                choices=choices,
            )
    sizes = {name: value for name, value in options.items() if name in MEMORY_OPTIONS}
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigurationError(
                f"option {name!r} must be a positive integer, not {value!r}", option=name
            )
    MemoryStore(**sizes)  # memcached's own rules for -I and -m (an empty store costs nothing)
    return sizes


# Each shared store with the serialisation options it was made with.
_SHARED: Registry[tuple[MemoryStore, SerdeOptions]] = Registry(
    on_reset=lambda shared: shared[0].flush_all()
)


def shared_memory_store(
    name: str,
    serde_options: SerdeOptions | None = None,
    *,
    on_refused: Callable[[ValueRefused], object] | None = None,
    **sizes: Any,
) -> MemoryStore:
    """Return the process-wide store called ``name``, creating it with these options.

    Every thread (and every Django backend instance) naming the same store
    shares its data, as Django's ``LocMemCache`` shares one dict per
    ``LOCATION``.  ``sizes`` (``max_bytes``, ``max_item_size``) and
    ``on_refused`` only matter to the first caller.  ``serde_options``
    (serializer and signing) decide how every value is written and read, so
    a caller asking for other ones than the store was made with gets
    :class:`ConfigurationError`: silently sharing the first caller's would
    store unsigned values for a cache configured to sign them.
    """
    wanted = serde_options if serde_options is not None else SerdeOptions()
    store, made_with = _SHARED.get_or_create(
        name, lambda: (MemoryStore(serde=wanted.build(on_refused), **sizes), wanted)
    )
    if made_with != wanted:
        # SerdeOptions' repr leaves the keys out; say so when only they differ.
        detail = f"{made_with!r}, not {wanted!r}"
        if repr(made_with) == repr(wanted):
            detail = "other signing keys"
        raise ConfigurationError(
            f"the embedded store {name!r} is already used with {detail}; give a cache with "
            "other serializer or signing options its own LOCATION",
            option="LOCATION",
        )
    return store


def reset_shared_memory_stores() -> None:
    """Forget (and empty) every shared store, e.g. between tests."""
    _SHARED.reset()
