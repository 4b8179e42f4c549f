"""The ring-change drill of issue 28, at full size: 20,000 keys on four servers, a fifth added.

What ``benchmarks/migrate_drill.py`` prints, asserted (``tests/drills/migration.py``
runs it): the hit ratio stays at 0.99 or more through the rollout where the new
ring alone would answer about 0.8; no read returns a key whose delete had
returned; copies keep their TTL within 5 s in meta mode (text mode: at most
``text_ttl``); the warm-up brings the new ring alone to 0.99 or more; caches of
the three configurations side by side never hold a lock twice or lose a set
member.  Sync (threads) and async (tasks of one loop), both protocols.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.drills.migration import drill
from tests.harness import MemcachedServer, memcached_cluster

pytestmark = pytest.mark.slow  # 20,000 keys, four phases, both drivers and protocols

KEYS = 20_000


@pytest.fixture(scope="module")
def five() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(5) as servers:
        yield servers


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_a_fifth_server_added_with_migrate_from(five, protocol, driver):
    figures = drill(five, protocol, driver, KEYS)
    assert 0.15 < figures.moved / KEYS < 0.3
    assert 0.7 < figures.cold_hit_ratio < 0.85  # what the change costs without migrate_from
    for phase in figures.phases:
        assert phase.hit_ratio >= 0.99, phase
        assert phase.stale == 0, phase
        assert phase.deletes > 0
        assert phase.doomed_reads > 0
    assert figures.copies["copied"] > 0
    assert figures.ttl_checked > 100
    if protocol == "meta":  # read with the value: the copy expires with the original
        assert figures.ttl_max_difference <= 5
    else:  # no TTL in text mode: text_ttl (60 s) at most
        assert figures.ttl_longest_copy <= 60
    assert figures.warm_copied > 0.15 * KEYS
    assert figures.warm_hit_ratio >= 0.99
    assert figures.most_holders == 1
    assert figures.lock_acquisitions == 6 * 25
    assert figures.members_lost == 0
