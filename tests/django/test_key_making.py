"""Keys made once and kept (make_and_validate_key's hot path) are exactly Django's keys.

The backend keeps the keys it made under the current prefix and version (two
generations, the hot ones kept) and checks only the caller's part of a new key when
the ``prefix:version:`` head is a valid key's.  Whatever the prefix, version and key,
the answer is what Django's ``make_key`` and the validation make of it, or the same
``InvalidCacheKey``, the first time and every time after.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache.backends.base import InvalidCacheKey
from hypothesis import given, settings
from hypothesis import strategies as st

from django_mcpatterns.backend import KetamaMemcacheCache
from django_mcpatterns.core.keys import shorten
from django_mcpatterns.memcached_contract import MADE_KEYS

# Key material: printable ASCII mostly, with what a valid key may not hold.
VALID = st.text(st.sampled_from("ab:_-.~09"), max_size=8)
ODD = st.text(st.sampled_from("ab: \t\x7fé€"), max_size=6) | st.text(max_size=4)
SPACED = st.text(st.sampled_from("ab: "), min_size=1, max_size=4)
LONG = st.integers(230, 260).map(lambda n: "k" * n)


def reference(cache: Any, key: str) -> str:
    """What the key is when made the long way (Django's make_key, then the check)."""
    made: str = cache.make_key(key)
    if cache._hash_long_keys:
        made = shorten(made)
    cache.validate_key(made)
    return made


def outcome(make: Any, key: str) -> tuple[str, str]:
    try:
        return "made", make(key)
    except InvalidCacheKey:
        return "refused", ""


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.one_of(VALID, VALID, ODD),
    version=st.integers(-3, 10**6) | st.sampled_from(["v", "a b"]),
    keys=st.lists(VALID | SPACED | ODD | LONG, min_size=1, max_size=6),
    long_keys=st.sampled_from(["refuse", "hash"]),
)
def test_made_keys_are_djangos_first_time_and_after(
    prefix: str, version: Any, keys: list[str], long_keys: str
) -> None:
    cache = KetamaMemcacheCache(
        "127.0.0.1:1",
        {"KEY_PREFIX": prefix, "VERSION": version, "OPTIONS": {"long_keys": long_keys}},
    )
    for _ in range(2):  # the second round reads what the first kept
        for key in keys:
            expected = outcome(lambda k: reference(cache, k), key)
            assert outcome(cache.make_and_validate_key, key) == expected


def test_hot_keys_stay_made_across_generations() -> None:
    """A key read while a generation fills moves into the new one: it is not made again."""
    cache = KetamaMemcacheCache("127.0.0.1:1", {"KEY_PREFIX": "p"})
    hot = cache.make_and_validate_key("hot")
    for i in range(3 * MADE_KEYS):
        assert cache.make_and_validate_key(f"cold{i}") == f"p:1:cold{i}"
        if i % 100 == 0:
            assert cache.make_and_validate_key("hot") is hot  # kept, not made again
    assert cache.make_and_validate_key("hot") is hot


@pytest.mark.parametrize("prefix", ["with space", "tab\t", "del\x7f"])
def test_a_head_no_key_can_have_refuses_every_key(prefix: str) -> None:
    cache = KetamaMemcacheCache("127.0.0.1:1", {"KEY_PREFIX": prefix})
    for _ in range(2):
        with pytest.raises(InvalidCacheKey):
            cache.make_and_validate_key("fine")
