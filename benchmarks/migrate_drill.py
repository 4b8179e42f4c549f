"""The figures of issue 28: a fifth server added to four under load, with ``migrate_from``.

Runs the drill of ``tests/drills/migration.py`` (which ``tests/drills/test_migration.py``
asserts) on five fresh memcached servers on loopback and prints, for each protocol and
driver: the cold baseline (the new ring without ``migrate_from``), the hit ratio and the
stale reads of each phase of the rollout, the copies' TTLs against their originals,
the warm-up, and the patterns drill.  Counts and ratios only: nothing is timed.

    python benchmarks/migrate_drill.py [--keys 20000] [--protocol meta,text] [--driver sync,async]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.drills.migration import drill, report
from tests.harness import memcached_cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--protocol", default="meta,text")
    parser.add_argument("--driver", default="sync,async")
    args = parser.parse_args()
    with memcached_cluster(5) as servers:
        for protocol in args.protocol.split(","):
            for driver in args.driver.split(","):
                for line in report(drill(servers, protocol, driver, args.keys)):
                    print(line, flush=True)


if __name__ == "__main__":
    main()
