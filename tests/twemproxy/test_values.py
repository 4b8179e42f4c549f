"""Issue 17 through a real twemproxy (nutcracker), in text mode: bump, chunks, compression.

nutcracker routes every key by its own hash, so there the chunks of a value
spread over the servers instead of staying on the key's one; a read still costs
two requests from the client (nutcracker fans the multi-get out).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import Nutcracker
from tests.twemproxy.frameworks import FRAMEWORKS, cache_through

OPTIONS = {
    "protocol": "text",
    "timeout": 5,
    "large_values": "chunk",
    "compressor": "zlib",
    "compress_min_len": 1024,
}
BIG = os.urandom(2 * 1024 * 1024 + 7)


@pytest.fixture(params=FRAMEWORKS)
def cache(request: pytest.FixtureRequest, nutcracker: Nutcracker) -> Iterator[Any]:
    with cache_through(nutcracker, request.param, OPTIONS) as cache:
        yield cache


def test_bump_through_twemproxy(cache: Any) -> None:
    cache.set("here", "value", 300)
    assert cache.bump("here") is True
    assert cache.bump("absent") is False
    assert cache.get("absent") is None
    assert cache.get("here") == "value"


def test_chunked_and_compressed_values_through_twemproxy(cache: Any) -> None:
    text = "compressible " * 100_000
    assert cache.set("big", BIG)
    assert cache.set("text", text)
    assert cache.get("big") == BIG
    assert cache.get("text") == text
