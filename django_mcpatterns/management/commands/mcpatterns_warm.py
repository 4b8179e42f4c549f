"""``manage.py mcpatterns_warm``: copy the old ring's items to their servers on the new one.

    manage.py mcpatterns_warm [--cache ALIAS] [--from HOST:PORT,...] [--rate N] [--json]

Run it while every process runs the ``"old"`` stage of ``OPTIONS["migrate_from"]``,
before reads switch (docs/operations.md, "Changing the ring").  ``--from``
defaults to ``migrate_from``'s servers; ``--rate`` caps the keys handled a
second.  Safe to run twice: what is on the new ring already is skipped.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...binding import ClusterBinding
from ...core.exceptions import ConfigurationError, NodeUnavailableError
from ...core.migrate.warm import WarmError
from ...page_rules import patterns_cache
from ...warming import Bar, old_ring, stage_warning, summary_rows, warmer
from ..base import CacheCommand


class Command(CacheCommand):
    help = "Copy the plain items of the old ring that now belong to another server (a warm-up)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--from",
            dest="servers",
            metavar="HOST:PORT,...",
            help="The old ring's servers (default: OPTIONS['migrate_from']['LOCATION']).",
        )
        parser.add_argument(
            "--rate", type=float, metavar="N", help="At most N keys a second (default: no limit)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = self.cache_alias(options["cache"])
        binding = getattr(patterns_cache(alias), "binding", None)
        if not isinstance(binding, ClusterBinding):
            raise CommandError(f"cache {alias!r} is the embedded in-process store: nothing to warm")
        rate = options["rate"]
        if rate is not None and rate <= 0:
            raise CommandError(f"--rate must be a positive number of keys a second, not {rate}")
        try:
            old = old_ring(binding, options["servers"])
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        warning = stage_warning(binding)
        if warning is not None:
            self.stderr.write(f"warning: {warning}")
        bar = None if options["json"] else Bar(self._write, self.stdout.isatty())
        try:
            stats = warmer(binding, old, rate, bar).run()
        except (WarmError, NodeUnavailableError, OSError) as exc:
            raise CommandError(f"the warm-up stopped: {exc}") from exc
        finally:
            if bar is not None:
                bar.close()
        if options["json"]:
            nodes = [server.node for server in old.servers]
            self.print_json({"cache": alias, "from": nodes, **stats.as_dict()})
            return
        self.stdout.write(f"Cache {alias!r}: warmed from {', '.join(s.node for s in old.servers)}")
        self.print_table(["", "count"], summary_rows(stats))

    def _write(self, text: str) -> None:
        self.stdout.write(text, ending="")
        self.stdout.flush()
