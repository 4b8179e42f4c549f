"""The ring a cache migrates from: ``OPTIONS["migrate_from"]``, checked once.

A ring change (a server added, removed or replaced, a move to a new pool)
sends about ``1/n`` of the keys to a server that has never seen them.  With
``migrate_from`` naming the previous ring, the cache serves them from there
until they are on the new one (:mod:`django_mcpatterns.core.migrate`)::

    "migrate_from": {
        "LOCATION": ["10.0.0.1:11211", "10.0.0.2:11211"],  # the ring before the change
        "ketama": "libmemcached",         # its variant (default: the cache's own)
        "until": "2026-12-01T00:00:00Z",  # when the read fallback ends (default: never)
        "reads": "new",                   # the rollout's stage: "old", then "new" (default)
        "text_ttl": 60,                   # TTL of a copy in text mode (no TTL can be read)
    }

``reads`` is the stage of a rolling deploy: ``"old"`` first (every process
still reads and writes the old ring, and deletes on both), then ``"new"``
(reads switch, a miss falls back to the old ring).  ``until`` ends the
read fallback only: deletes keep going to both rings while the option is set.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..exceptions import ConfigurationError
from ..ketama import VARIANTS, Continuum
from .servers import Server, parse_servers

__all__ = [
    "MIGRATE_FROM_KEYS",
    "READS",
    "TEXT_TTL",
    "MigrationSource",
    "check_migrate_from",
    "describe",
]

READS = ("old", "new")
TEXT_TTL = 60  # seconds a text-mode copy lives at most (docs/operations.md)
MIGRATE_FROM_KEYS = ("LOCATION", "ketama", "until", "reads", "text_ttl")


@dataclass(frozen=True)
class MigrationSource:
    """The old ring of a migration and the stage of its rollout (see the module docstring)."""

    servers: tuple[Server, ...]
    ketama: str
    until: float | None = None  # Unix time; None: the fallback never ends by itself
    reads: Literal["old", "new"] = "new"
    text_ttl: int = TEXT_TTL

    @property
    def nodes(self) -> list[str]:
        return [server.node for server in self.servers]

    def ring(self) -> Continuum:
        """The old ring, as the old configuration's clients built it."""
        weighted = any(s.weight != 1 for s in self.servers)
        return Continuum(
            self.nodes,
            weights=[s.weight for s in self.servers] if weighted else None,
            variant=self.ketama,
            names=[s.name for s in self.servers],
        )

    def falls_back(self, now: float) -> bool:
        """Whether a miss on the new ring is read from the old one at ``now`` (Unix time)."""
        return self.reads == "new" and (self.until is None or now < self.until)


def check_migrate_from(value: object, ketama: str) -> MigrationSource | None:
    """Validate ``OPTIONS["migrate_from"]`` (``ketama``: the cache's own variant, the default)."""
    if value is None or isinstance(value, MigrationSource):
        return value
    if not isinstance(value, Mapping):
        raise _error(f"must be a mapping with 'LOCATION' (the old ring), not {value!r}")
    unknown = sorted(set(value) - set(MIGRATE_FROM_KEYS))
    if unknown:
        raise _error(
            f"unknown key {unknown[0]!r}; valid keys: "
            + ", ".join(repr(k) for k in MIGRATE_FROM_KEYS)
        )
    if "LOCATION" not in value:
        raise _error("needs 'LOCATION': the servers of the ring the cache migrates from")
    location = value["LOCATION"]
    try:
        servers = parse_servers(location if isinstance(location, str) else list(location))
    except (ConfigurationError, TypeError) as exc:
        raise _error(f"'LOCATION': {exc}") from exc
    variant = value.get("ketama", ketama)
    if variant not in VARIANTS:
        raise _error(
            f"invalid 'ketama' {variant!r}; valid choices: " + ", ".join(repr(v) for v in VARIANTS)
        )
    reads = value.get("reads", "new")
    if reads not in READS:
        raise _error(f"'reads' is 'old' (the first stage) or 'new' (the second), not {reads!r}")
    text_ttl = value.get("text_ttl", TEXT_TTL)
    if isinstance(text_ttl, bool) or not isinstance(text_ttl, int) or text_ttl < 1:
        raise _error(f"'text_ttl' must be a whole number of seconds >= 1, not {text_ttl!r}")
    return MigrationSource(servers, variant, _until(value.get("until")), reads, text_ttl)


def _until(value: object) -> float | None:
    """``until`` as Unix time: ISO 8601 with an offset (or ``Z``), an aware datetime, a number."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _error(f"'until' must be a time, not {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise _error(f"'until' is not an ISO 8601 time: {value!r}") from exc
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise _error(f"'until' needs a time zone (e.g. '...Z' for UTC): {value.isoformat()}")
        return value.timestamp()
    raise _error(f"'until' must be an ISO 8601 string, a datetime or a Unix time, not {value!r}")


def _error(message: str) -> ConfigurationError:
    return ConfigurationError(f"option 'migrate_from': {message}", option="migrate_from")


def describe(source: MigrationSource) -> dict[str, Any]:
    """The settings as a status page or a command shows them."""
    until = source.until
    return {
        "servers": source.nodes,
        "ketama": source.ketama,
        "reads": source.reads,
        "until": None
        if until is None
        else datetime.datetime.fromtimestamp(until, datetime.UTC).isoformat(),
        "text_ttl": source.text_ttl,
    }
