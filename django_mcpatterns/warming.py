"""What ``manage.py mcpatterns_warm`` and ``flask mcpatterns-warm`` share.

The old ring's cluster (from ``--from``, or the cache's ``migrate_from``), a
check of the rollout's stage, the progress bar and the summary.  The copier is
:class:`~django_mcpatterns.core.migrate.warm.Warmer`.  Imports neither Django
nor Flask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .binding import ClusterBinding
from .core.cluster import Cluster, shared_cluster
from .core.exceptions import ConfigurationError
from .core.migrate.warm import Warmer, WarmStats
from .core.servers import parse_servers

Write = Callable[[str], object]

__all__ = ["Bar", "old_ring", "stage_warning", "summary_rows", "warmer"]


def old_ring(binding: ClusterBinding, servers: str | None) -> Cluster:
    """The cluster to copy from: ``servers`` (``HOST:PORT,...``) or ``migrate_from``'s.

    Built as the migration's fallback ring is: failover ``"miss"``, no gutter.
    Raise :class:`ConfigurationError` when neither names the old ring.
    """
    migration = binding.migration
    if servers is None:
        if migration is None:
            raise ConfigurationError(
                "give the old ring's servers (--from HOST:PORT,...): this cache has no "
                "OPTIONS['migrate_from']"
            )
        return migration.fallback
    parsed = parse_servers(servers)
    options = binding.store.options
    ketama = migration.source.ketama if migration is not None else options.ketama
    bare = dataclasses.replace(
        options, ketama=ketama, failover="miss", gutter=(), raise_errors=False
    )
    return shared_cluster(parsed, bare)


def stage_warning(binding: ClusterBinding) -> str | None:
    """Why copying now could serve a stale value later, or None (the ``"old"`` stage)."""
    migration = binding.migration
    if migration is not None and migration.source.reads == "old":
        return None
    return (
        "warm a new ring while every process runs the 'old' stage of migrate_from "
        "(reads 'old': deletes reach both rings); a process without it deletes on the "
        "old ring only, and a copy made now could outlive that delete"
    )


def warmer(binding: ClusterBinding, old: Cluster, rate: float | None, bar: Bar | None) -> Warmer:
    return Warmer(binding.store, old, rate=rate, progress=bar)


class Bar:
    """A progress bar: redrawn in place on a terminal, a line every tenth otherwise.

    ``write`` writes text as given (no line end added).
    """

    def __init__(self, write: Write, tty: bool, width: int = 30) -> None:
        self.write = write
        self.tty = tty
        self.width = width
        self._tenth = -1

    def __call__(self, done: int, total: int, stats: WarmStats) -> None:
        total = max(total, done, 1)
        fraction = done / total
        filled = int(self.width * fraction)
        line = (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} keys, "
            f"{stats.copied} copied ({_size(stats.bytes)}), {stats.skipped} skipped, "
            f"{stats.failed} failed"
        )
        if self.tty:
            self.write("\r" + line)
        elif int(fraction * 10) > self._tenth:
            self._tenth = int(fraction * 10)
            self.write(line + "\n")

    def close(self) -> None:
        if self.tty:
            self.write("\n")


def summary_rows(stats: WarmStats) -> list[tuple[str, Any]]:
    """The summary's lines: what was copied, what was skipped and why."""
    return [
        ("keys listed", stats.listed),
        ("items copied", stats.copied),
        ("bytes copied", stats.bytes),
        ("skipped", stats.skipped),
        ("  already on their server", stats.in_place),
        ("  already on the new ring", stats.present),
        ("  not plain values (pattern state, numbers, raw bytes)", stats.not_plain),
        ("  expired or deleted", stats.gone),
        ("  a write or delete won the race", stats.lost),
        ("failed", stats.failed),
    ]


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"
