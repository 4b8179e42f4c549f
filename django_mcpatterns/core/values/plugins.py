"""Import a class an option names by dotted path (``OPTIONS['serializer']``, ``compressor``).

One place checks what such a path gives: that it imports, and that it is a
subclass of the base the option takes; the errors name the option.
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from ..exceptions import ConfigurationError

__all__ = ["import_subclass"]

T = TypeVar("T")


def import_subclass(
    path: str, base: type[T], option: str, valid: str, choices: object = None
) -> type[T]:
    """Return the subclass of ``base`` at dotted ``path`` (``OPTIONS[option]``).

    ``valid`` ends the import error's message (what the option accepts) and
    ``choices`` is that error's closed set of values, if any.
    """
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"option '{option}': cannot import {path!r} ({exc}); {valid}",
            option=option,
            choices=choices,
        ) from exc
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ConfigurationError(
            f"option '{option}': {path!r} is not a subclass of "
            f"{base.__module__}.{base.__qualname__}",
            option=option,
        )
    return found
