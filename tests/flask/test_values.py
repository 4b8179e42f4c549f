"""Issue 17 on Flask-Caching: compression, large values, long keys, bump, zero-byte values.

Flask-Caching's conventions hold: an invalid key is a miss or False, never an
exception; ``set`` of a value that cannot be cached answers False.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from dataclasses import replace
from typing import Any

import pytest

from django_mcpatterns.core.exceptions import ConfigurationError
from tests.flask.conftest import PREFIX, FlaskDeployment, deployments
from tests.harness import raw_client

deployment = deployments("cluster3", "embedded")

BIG = os.urandom(2 * 1024 * 1024 + 5)
ROWS = {"rows": [{"id": i, "name": f"user {i}", "mail": f"u{i}@x.org"} for i in range(3000)]}
LONG = "page:" + "/segment" * 50


def cache_with(deployment: FlaskDeployment, **options: Any) -> Any:
    return replace(deployment, options={**deployment.options, **options}).make_cache()


def test_compressed_values(deployment: FlaskDeployment) -> None:
    cache = cache_with(deployment, compressor="zlib", compress_min_len=1024)
    assert cache.set("rows", ROWS)
    assert cache.get("rows") == ROWS
    for server in deployment.servers:
        line = raw_client(server).raw_command(f"mg {PREFIX}rows s f".encode(), b"\r\n")
        if line.startswith(b"HD"):
            size, flags = (int(token[1:]) for token in line.split()[1:])
            assert flags == 1 | 8
            assert size < 0.3 * len(pickle.dumps(ROWS, pickle.HIGHEST_PROTOCOL))


def test_large_values_are_refused_by_default(deployment: FlaskDeployment) -> None:
    cache = cache_with(deployment)
    assert cache.set("big", BIG) is False
    assert cache.get("big") is None


def test_large_values_in_chunks(deployment: FlaskDeployment) -> None:
    cache = cache_with(deployment, large_values="chunk")
    assert cache.set("big", BIG)
    assert cache.get("big") == BIG
    assert cache.has("big")
    assert cache.get_dict("big", "absent") == {"big": BIG, "absent": None}
    assert cache.set_many({"big2": BIG[::-1], "small": 1}) == ["big2", "small"]
    assert cache.get("big2") == BIG[::-1]
    assert cache.add("big", b"x") is False


def test_long_keys_are_misses_by_default_and_hashed_on_request(
    deployment: FlaskDeployment,
) -> None:
    plain = cache_with(deployment)
    assert plain.set(LONG, 1) is False  # Flask-Caching: an invalid key is not an error
    assert plain.get(LONG) is None
    hashing = cache_with(deployment, long_keys="hash")
    assert hashing.set(LONG, "value")
    assert hashing.get(LONG) == "value"
    assert hashing.get(LONG + "/more") is None
    assert len(hashing._pattern_key(LONG).encode()) <= 250


def test_bump(deployment: FlaskDeployment) -> None:
    cache = cache_with(deployment)
    cache.set("here", "v", timeout=300)
    assert cache.bump("here") is True
    assert cache.bump("absent") is False
    assert cache.bump("with space") is False  # an invalid key: a miss
    assert cache.get("absent") is None
    assert asyncio.run(cache.abump("here")) is True
    assert asyncio.run(cache.abump("absent")) is False


@pytest.mark.parametrize("value", [b"", ""], ids=["bytes", "str"])
def test_zero_byte_values_are_hits(deployment: FlaskDeployment, value: Any) -> None:
    cache = cache_with(deployment)
    assert cache.set("empty", value)
    assert cache.has("empty")
    assert cache.get("empty") == value


@pytest.mark.parametrize(
    "options",
    [{"large_values": "split"}, {"long_keys": "cut"}, {"compressor": "lzma"}],
)
def test_bad_options_name_the_setting(deployment: FlaskDeployment, options: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        cache_with(deployment, **options)
    assert "CACHE_OPTIONS" in str(caught.value)
    assert caught.value.option == next(iter(options))
