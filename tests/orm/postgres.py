"""A PostgreSQL server for the ORM cache tests and benchmark: Debian's postgresql, on loopback.

``initdb`` makes a throwaway cluster in a temporary directory owned by the
``postgres`` user, and ``postgres`` serves it on a free loopback TCP port (the
unix socket in that directory too), run as that user through ``setpriv`` (which
execs, so the pid we hold is the server's), bounded in time and stopped by pid
(:mod:`tests.processes`).  Durability is off: a test cluster never outlives the
run.  :func:`database_settings` is the ``DATABASES`` entry for Django.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.harness import LOOPBACK, free_port, missing
from tests.processes import ServerProcess

START_TIMEOUT = 60


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        missing("postgresql is not installed (apt-get install -y postgresql); scripts/test.sh does")
    return os.path.dirname(found[-1])


@dataclass
class Postgres:
    """One PostgreSQL server of the test's own."""

    port: int = field(default_factory=free_port)
    root: str = ""
    executor: ServerProcess | None = None

    def start(self) -> Postgres:
        if os.geteuid() != 0:
            missing("PostgreSQL tests run as root (they start the server as the postgres user)")
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            missing("the postgres user does not exist (apt-get install -y postgresql)")
        bindir = _bindir()
        self.root = tempfile.mkdtemp(prefix="mcpatterns-pg-")
        os.chown(self.root, user.pw_uid, user.pw_gid)
        data = os.path.join(self.root, "data")
        as_postgres = [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
        ]
        subprocess.run(
            [
                *as_postgres,
                f"{bindir}/initdb",
                "-D",
                data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
            cwd=self.root,
        )
        self.executor = ServerProcess(
            [
                *as_postgres,
                f"{bindir}/postgres",
                "-D",
                data,
                "-p",
                str(self.port),
                "-h",
                LOOPBACK,
                "-k",
                self.root,
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=40",
            ],
            (LOOPBACK, self.port),
            name="postgres",
            timeout=START_TIMEOUT,
        ).start()
        # Its port opens before it accepts sessions ("the database system is starting
        # up"): wait until pg_isready says it accepts them (bounded: a hang guard).
        deadline = time.monotonic() + START_TIMEOUT
        ready = [f"{bindir}/pg_isready", "-q", "-h", LOOPBACK, "-p", str(self.port)]
        while subprocess.run(ready, timeout=START_TIMEOUT).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres on port {self.port} never accepted connections")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.executor is not None:
            self.executor.stop(signal.SIGINT, timeout=30)  # "fast" shutdown
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    def database_settings(self, name: str = "postgres") -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": "postgres",
            "HOST": LOOPBACK,
            "PORT": str(self.port),
        }


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    try:
        yield server.start()
    finally:
        server.stop()


def add_database(alias: str, entry: dict[str, Any]) -> None:
    """Make ``alias`` a database of this process's Django, after setup (the tests' own server)."""
    from django.db import connections

    full = dict(connections.settings["default"])  # every key Django fills in, then ours
    full.update(entry)
    full["TEST"] = {
        "NAME": entry["NAME"],
        "MIRROR": None,
        "CHARSET": None,
        "COLLATION": None,
        "MIGRATE": False,
        "DEPENDENCIES": [],
    }
    full.setdefault("OPTIONS", {})
    full["OPTIONS"] = {}
    connections.settings[alias] = full


def remove_database(alias: str) -> None:
    from django.db import connections

    with contextlib.suppress(Exception):
        connections[alias].close()
    connections.settings.pop(alias, None)
    with contextlib.suppress(AttributeError, KeyError):
        delattr(connections._connections, alias)
