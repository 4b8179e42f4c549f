"""Stamps' pure parts: a cached result pickles as itself, registries parse the same every time."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from django_mcpatterns.core.stamps import Cached, Registry
from django_mcpatterns.core.stamps._model import registry_line, registry_start

OLD_FORM = (
    b"\x80\x05\x95G\x00\x00\x00\x00\x00\x00\x00\x8c$django_mcpatterns.core.stamps._model"
    b"\x94\x8c\x06Cached\x94\x93\x94)\x81\x94]\x94(C\x01a\x94\x85\x94K\x01K\x02\x86\x94eb."
)
"""``Cached((b"a",), (1, 2))`` as the dataclass's own pickling wrote it (earlier versions)."""

tokens = st.lists(st.binary(min_size=1, max_size=16), max_size=6).map(tuple)
values = st.recursive(
    st.none() | st.integers() | st.text() | st.binary(), lambda v: st.lists(v) | st.tuples(v, v)
)


@given(tokens, values)
def test_a_cached_result_pickles_as_itself(tokens: tuple[bytes, ...], value: object) -> None:
    cached = Cached(tokens, value)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(cached, protocol))
        assert type(again) is Cached
        assert again == cached


def test_a_result_stored_by_an_earlier_version_still_loads() -> None:
    assert pickle.loads(OLD_FORM) == Cached((b"a",), (1, 2))


schemes = st.lists(
    st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), min_size=1, max_size=3).map(
        lambda s: tuple(sorted(s))
    ),
    min_size=1,
    max_size=5,
)


@given(st.binary(min_size=1, max_size=16).map(bytes.hex).map(str.encode), schemes)
def test_a_registry_parses_the_same_every_time(
    generation: bytes, listed: list[tuple[str, ...]]
) -> None:
    raw = registry_start(generation, listed[0]) + b"".join(registry_line(s) for s in listed[1:])
    first, again = Registry.parse(raw), Registry.parse(bytes(raw))
    assert first == again == Registry(generation, frozenset(listed))
    assert Registry.parse(b"x" + raw) is None
