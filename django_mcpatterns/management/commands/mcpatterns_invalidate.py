"""``manage.py mcpatterns_invalidate``: invalidate a namespace from the shell.

    manage.py mcpatterns_invalidate [--cache ALIAS] PART [PART ...] [--nested PART [PART ...]]...
                                    [--json]

``manage.py mcpatterns_invalidate user 42`` does what
``cache.invalidate_namespace("user", 42)`` does: parts are text, and an int
part is its decimal text, so ``42`` names the same namespace as ``"42"``.
Each ``--nested`` adds a level: ``org 1 --nested user 42`` is
``cache.namespace("org", 1).namespace("user", 42)``.  One ``incr``; an
unreachable server is an error, never a silent no-op.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...core.exceptions import NodeUnavailableError
from ...core.memory import MemoryStore
from ...decorators import patterns_cache
from ..base import CacheCommand


class Command(CacheCommand):
    help = "Invalidate every key of a cache namespace (one incr of its version key)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("parts", nargs="+", metavar="PART", help="The namespace's parts.")
        parser.add_argument(
            "--nested",
            action="append",
            nargs="+",
            default=[],
            metavar="PART",
            help="The parts of a nested level (repeatable, outermost first).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = self.cache_alias(options["cache"])
        cache = patterns_cache(alias)
        if isinstance(cache.store, MemoryStore):
            self.stderr.write(
                f"cache {alias!r} is the embedded in-process store: only this process's "
                "copy is invalidated (other processes keep their own)"
            )
        namespace = cache.namespace(*options["parts"])
        for parts in options["nested"]:
            namespace = namespace.namespace(*parts)
        try:
            version = namespace.invalidate()
        except NodeUnavailableError as exc:
            raise CommandError(f"namespace not invalidated: {exc}") from exc
        if not version:  # degraded (OPTIONS["on_outage"]): a command cannot wait to repair it
            raise CommandError(
                "namespace not invalidated: its server cannot be reached (run the command "
                "again once it answers)"
            )
        path = [list(level) for level in namespace.path]
        if options["json"]:
            self.print_json({"cache": alias, "namespace": path, "version": version})
        else:
            levels = " / ".join(" ".join(level) for level in namespace.path)
            self.stdout.write(
                f"Invalidated namespace {levels} in cache {alias!r} (version {version})"
            )
