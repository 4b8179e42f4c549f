"""A profile's interests: rows in the database, read from a memcached set.

The set is loader-backed (``docs/sets.md``, "Eviction and loaders"): the rows
are the source of truth, so a set that memcached evicted or expired is rebuilt
from them by the next read instead of reading as empty.  Writers change the
rows first and the set once the transaction commits: a rolled-back write never
reaches the cache.
"""

from functools import partial

from django.core.cache import cache
from django.db import transaction

from .models import Interest


def _key(profile_id: int) -> str:
    return f"profile:{profile_id}:interests"


def _load(profile_id: int) -> set[str]:
    return set(Interest.objects.filter(profile_id=profile_id).values_list("name", flat=True))


def interests(profile_id: int) -> list[str]:
    """The profile's interests, sorted: one ``gets`` while the set is cached."""
    return sorted(cache.smembers(_key(profile_id), loader=partial(_load, profile_id)))


def add_interest(profile_id: int, name: str) -> None:
    Interest.objects.get_or_create(profile_id=profile_id, name=name)
    transaction.on_commit(
        lambda: cache.sadd(_key(profile_id), name, loader=partial(_load, profile_id))
    )


def remove_interest(profile_id: int, name: str) -> None:
    Interest.objects.filter(profile_id=profile_id, name=name).delete()
    transaction.on_commit(
        lambda: cache.srem(_key(profile_id), name, loader=partial(_load, profile_id))
    )
