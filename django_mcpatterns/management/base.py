"""What the mcpatterns_* commands share: the ``--cache``/``--json`` options and text tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ..inspection import pattern_aliases


class CacheCommand(BaseCommand):
    """A command about one cache alias, printing text tables or JSON."""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--cache",
            default="default",
            metavar="ALIAS",
            help="The CACHES alias to inspect (default: %(default)s).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON instead of tables.")

    def cache_alias(self, alias: str) -> str:
        """Return ``alias`` once it names a cache served by our backends, else CommandError."""
        ours = pattern_aliases()
        if alias not in settings.CACHES:
            raise CommandError(
                f"no cache {alias!r} in CACHES; django-mcpatterns caches: {_names(ours)}"
            )
        if alias not in ours:
            raise CommandError(
                f"cache {alias!r} does not use a django-mcpatterns backend; ours: {_names(ours)}"
            )
        caches[alias]  # builds the backend: a bad configuration fails here, not later
        return alias

    def print_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=False))

    def print_table(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        """Print a table; the first column is left-aligned, the others right-aligned."""
        cells = [[str(c) for c in header], *[[_cell(c) for c in row] for row in rows]]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        for row in cells:
            parts = [
                value.ljust(width) if i == 0 else value.rjust(width)
                for i, (value, width) in enumerate(zip(row, widths, strict=True))
            ]
            self.stdout.write("  ".join(parts).rstrip())


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.2f}%"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _names(aliases: Sequence[str]) -> str:
    return ", ".join(repr(a) for a in aliases) or "none"
