"""Run django-redis 7.0's own set tests against both Django backends of this project.

A team moving from django-redis keeps its set code: this runs the set tests of
django-redis's source distribution (``tests/test_backend.py``: ``sadd`` ...
``sunionstore``, ``sscan``, ``sscan_iter``), unchanged but for the two guards that
ask django-redis's own client object (``isinstance(cache.client, ShardClient)``,
``cache.client._has_compression_enabled()``; our caches have no such client and
compress nothing by default: both read False), against ``KetamaMemcacheCache`` on
a memcached started on a free loopback port and against ``LocMemPatternsCache``.

    .venv/bin/python scripts/django_redis_sets.py [--version 7.0.0]

django-redis and redis (which its test module imports) are installed with pip
into a temporary directory, not into the environment.  The one expected failure
is ``test_srem``: ``srem`` returns how many members were written, not how many
were present (docs/sets.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SET_TESTS = [
    "test_sadd",
    "test_scard",
    "test_sdiff",
    "test_sdiffstore",
    "test_sdiffstore_with_keys_version",
    "test_sdiffstore_with_different_keys_versions_without_initial_set_in_version",
    "test_sdiffstore_with_different_keys_versions_with_initial_set_in_version",
    "test_sinter",
    "test_interstore",
    "test_sismember",
    "test_smove",
    "test_spop_default_count",
    "test_spop",
    "test_srandmember_default_count",
    "test_srandmember",
    "test_srem",
    "test_sscan",
    "test_sscan_with_match",
    "test_sscan_iter",
    "test_sscan_iter_with_match",
    "test_smismember",
    "test_sunion",
    "test_sunionstore",
]

CONFTEST = """
import os
import sys

import django
import pytest
from django.conf import settings

sys.path.insert(0, {root!r})

BACKENDS = {{
    "cluster": "django_mcpatterns.backend.KetamaMemcacheCache",
    "embedded": "django_mcpatterns.backend.LocMemPatternsCache",
}}


def pytest_configure(config):
    from tests.harness import memcached_cluster

    kind = os.environ["BACKEND"]
    location = "django-redis-sets"
    if kind == "cluster":
        config._memcached = memcached_cluster(1)
        location = [server.spec for server in config._memcached.__enter__()]
    settings.configure(
        SECRET_KEY="django_tests_secret_key",
        CACHES={{"default": {{"BACKEND": BACKENDS[kind], "LOCATION": location}}}},
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes"],
        USE_TZ=False,
    )
    django.setup()


def pytest_unconfigure(config):
    if getattr(config, "_memcached", None) is not None:
        config._memcached.__exit__(None, None, None)


@pytest.fixture
def cache():
    from django.core.cache import cache as default_cache

    yield default_cache
    default_cache.clear()
"""


def fetch(version: str, into: Path) -> Path:
    """django-redis's sdist (for its tests) and the packages its test module imports."""
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [
            *pip,
            "download",
            f"django-redis=={version}",
            "--no-binary",
            ":all:",
            "--no-deps",
            "-d",
            str(into),
        ],
        check=True,
    )
    site = into / "site"
    subprocess.run(
        [
            *pip,
            "install",
            "--target",
            str(site),
            f"django-redis=={version}",
            "redis",
            "msgpack",
            "--no-deps",
        ],
        check=True,
    )
    (sdist,) = into.glob("django_redis-*.tar.gz")
    with tarfile.open(sdist) as archive:
        member = archive.getmember(f"{sdist.name.removesuffix('.tar.gz')}/tests/test_backend.py")
        source = archive.extractfile(member)
        assert source is not None
        text = source.read().decode()
    text = re.sub(r"isinstance\(cache\.client, ShardClient\)", "False", text)
    text = text.replace("cache.client._has_compression_enabled()", "False")
    tests = into / "tests"
    tests.mkdir()
    (tests / "test_backend.py").write_text(text)
    (tests / "conftest.py").write_text(CONFTEST.format(root=str(ROOT)))
    (tests / "pytest.ini").write_text("[pytest]\n")
    return tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="7.0.0", help="django-redis version (7.0.0)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="django-redis-") as tmp:
        tests = fetch(args.version, Path(tmp))
        selected = " or ".join(f"{name}" for name in SET_TESTS)
        for kind in ("cluster", "embedded"):
            print(f"== django-redis {args.version} set tests against {kind}", flush=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-p",
                    "no:randomly",
                    "-c",
                    str(tests / "pytest.ini"),
                    "--rootdir",
                    str(tests),
                    str(tests / "test_backend.py"),
                    "-k",
                    selected,
                    "-rf",
                ],
                cwd=tests,
                env={
                    "BACKEND": kind,
                    "PYTHONPATH": f"{Path(tmp) / 'site'}",
                    "PATH": "/usr/bin:/bin",
                },
                check=False,
            )
    return 0  # test_srem fails by design: read the counts


if __name__ == "__main__":
    raise SystemExit(main())
