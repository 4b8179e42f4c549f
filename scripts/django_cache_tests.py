"""Run Django's own cache tests against our backends (upstream/django_cache/).

The tests are those of the installed Django: ``tests/cache/`` of its source distribution, which
pip downloads once per version into .tox/django-tests/<version>/.  Extra arguments go to pytest
(``-W error::ResourceWarning``, ``-k``...).  Usage, in an environment with the project and its
test extra installed (tox.ini's py313-django61-contract)::

    python scripts/django_cache_tests.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "tests/cache/"


def django_tests(version: str) -> Path:
    """The folder holding Django ``version``'s ``cache`` test app, fetched if not there yet."""
    folder = ROOT / ".tox" / "django-tests" / version
    if (folder / "cache" / "tests.py").exists():
        return folder
    with tempfile.TemporaryDirectory() as download:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", download]
        subprocess.run(
            [*pip, "--no-binary", ":all:", f"Django=={version}"],
            check=True,
        )
        (sdist,) = Path(download).glob("*.tar.gz")
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                _, _, path = member.name.partition("/")  # drop "django-<version>/"
                if path.startswith(PREFIX) and member.isfile():
                    member.name = path.removeprefix("tests/")
                    members.append(member)
            if not members:
                sys.exit(f"!!! no {PREFIX} in {sdist.name}")
            staging = folder.with_name(f"{version}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
            archive.extractall(staging, members=members, **safe)
    shutil.rmtree(folder, ignore_errors=True)
    staging.replace(folder)
    return folder


def main() -> int:
    env = dict(os.environ, DJANGO_TESTS=str(django_tests(django.get_version())))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    command += ["--ds", "upstream.django_cache.settings", "upstream/django_cache", *sys.argv[1:]]
    print(f"Django {django.get_version()}'s own cache tests:", " ".join(command[1:]), flush=True)
    return subprocess.run(command, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
