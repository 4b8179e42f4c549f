"""The key rules of core/keys.py: long keys' digest form, and its key space."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from django_mcpatterns.core.keys import MAX_KEY_LENGTH, key_bytes, shorten

DIGEST_FORM = re.compile(rb":#[0-9a-f]{40}\Z")

# Valid key bytes (no whitespace, no control bytes), of any length: some over 250.
KEY_BYTES = st.binary(min_size=1, max_size=400).map(
    lambda raw: bytes(b if 0x20 < b < 0x7F or b > 0x7F else 0x41 for b in raw)
)
# Keys that end like a digest form, as a caller could spell one.
SPELLED = st.tuples(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=200),
    st.text("0123456789abcdef", min_size=40, max_size=40),
).map(lambda parts: f"{parts[0]}:#{parts[1]}")


@given(KEY_BYTES)
def test_every_key_becomes_a_valid_one(raw: bytes) -> None:
    made = shorten(raw)
    assert key_bytes(made) == made
    assert len(made) <= MAX_KEY_LENGTH
    assert made == raw or DIGEST_FORM.search(made)


@given(KEY_BYTES)
def test_a_key_left_alone_never_looks_like_a_digest_form(raw: bytes) -> None:
    """So the keys left alone and the digest forms are two disjoint sets."""
    made = shorten(raw)
    if made == raw:
        assert not DIGEST_FORM.search(raw)
    else:
        assert DIGEST_FORM.search(made)


@given(SPELLED)
def test_a_key_spelled_like_a_digest_form_is_hashed_whatever_its_length(key: str) -> None:
    made = shorten(key)
    assert made != key
    assert isinstance(made, str)
    assert shorten(key) == made  # stable
    assert DIGEST_FORM.search(made.encode())


def test_keys_that_fit_and_do_not_end_like_a_digest_are_untouched() -> None:
    assert shorten("user:42") == "user:42"
    assert shorten(b"a:#123") == b"a:#123"
    assert shorten("x" * 250) == "x" * 250
    assert len(shorten("x" * 251).encode()) == 250
