"""Fixtures shared by every test: real memcached servers on loopback."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.drills.tls import Certificate, make_certificate, tls_memcached
from tests.harness import MemcachedServer, Nutcracker, memcached_cluster, nutcracker_on
from tests.processes import deaths

# No wall clock in any test: hypothesis's per-example deadline (200 ms) and its "too slow"
# health check time the machine, and failed examples on a busy one (a ketama ring of
# 500 servers took 265 ms).  Performance is measured in benchmarks/.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture(scope="session")
def memcached_1() -> Iterator[list[MemcachedServer]]:
    """One memcached server for the whole session (flush it where state matters)."""
    with memcached_cluster(1) as servers:
        yield servers


@pytest.fixture(scope="session")
def memcached_3() -> Iterator[list[MemcachedServer]]:
    """Three memcached servers for the whole session."""
    with memcached_cluster(3) as servers:
        yield servers


@pytest.fixture
def memcached_4_fresh() -> Iterator[list[MemcachedServer]]:
    """Four servers of the test's own, for tests that kill, pause or restart them."""
    with memcached_cluster(4) as servers:
        yield servers


def flush(servers: list[MemcachedServer]) -> None:
    for server in servers:
        server.flush()


@pytest.fixture(scope="session")
def nutcracker(
    memcached_3: list[MemcachedServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Nutcracker]:
    """nutcracker (ketama, md5) in front of the session's three servers, for the session."""
    with nutcracker_on(memcached_3, tmp_path_factory.mktemp("nutcracker")) as proxy:
        yield proxy


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test says which servers died under it, how, and what they last wrote.

    Without this, a dead session memcached shows only as ConnectionRefused in every
    later test; CI logs then cannot tell a crash from a kill.
    """
    report = yield
    if report.failed:
        dead = deaths()
        if dead:
            report.sections.append(("servers that died during the run", "\n".join(dead)))
    return report


# Deaths the xdist workers saw (each worker starts servers of its own), told to the
# controller at each worker's end.
_WORKER_DEATHS: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if output is not None:
        output["deaths"] = deaths()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    _WORKER_DEATHS.extend(getattr(node, "workeroutput", {}).get("deaths", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The run's summary names every server that died on its own, even if no test failed."""
    dead = [*deaths(), *_WORKER_DEATHS]
    if dead:
        terminalreporter.section("servers that died during the run", red=True)
        for line in dead:
            terminalreporter.line(line)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    """A self-signed certificate for the module's TLS memcached (tests/drills/tls.py)."""
    return make_certificate(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def tls_server(certificate: Certificate) -> Iterator[MemcachedServer]:
    """memcached started with ``-Z`` and ``certificate``, for the module."""
    with tls_memcached(certificate) as server:
        yield server
