import os
import re
import signal
import socket
from pathlib import Path

import pytest

from tests.harness import memcached_cluster, start_memcached
from tests.processes import deaths, forget


def test_servers_answer_and_stop_by_pid():
    with memcached_cluster(2) as servers:
        pids = {server.pid for server in servers}
        assert len(pids) == 2
        for server in servers:
            with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
                sock.sendall(b"version\r\n")
                assert sock.recv(64).startswith(b"VERSION 1.")
    for server in servers:
        assert not server.executor.running()


def test_servers_carry_no_mirakuru_marker():
    """The flake: at exit, any Python that imported mirakuru SIGKILLs every process whose
    ``mirakuru_uuid`` (``<run's pid>:<uuid4>``) merely CONTAINS its pid, e.g. a run whose
    pid is 4242 killed the servers of a run with pid 24242.  Ours carry no marker."""
    with memcached_cluster(1) as (server,):
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert not [item for item in environ if item.startswith(b"mirakuru_uuid=")]


def test_no_test_imports_mirakuru():
    """Importing mirakuru registers that atexit cleanup in the test run itself (and in
    every process forked from it): start servers with tests.processes instead."""
    root = Path(__file__).resolve().parents[1]
    importing = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"^\s*(from|import) mirakuru\b", path.read_text(), re.MULTILINE)
    ]
    assert importing == []


def test_a_server_killed_from_outside_is_reported_with_its_signal():
    with memcached_cluster(1) as (server,):
        os.kill(server.pid, signal.SIGKILL)  # not through the harness: someone else's kill
        server.executor.process.wait(10)
        (line,) = [d for d in deaths() if f"pid {server.pid} " in d]
        assert "killed by SIGKILL" in line
        assert str(server.port) in line
    (line,) = [d for d in deaths() if f"pid {server.pid} " in d]  # still told after teardown
    forget(server.pid)  # a drill: later failures of this run need not hear of it


def test_a_server_that_exits_on_its_own_is_reported_with_its_status():
    with memcached_cluster(1) as (server,):
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
            sock.sendall(b"shutdown\r\n")  # refused without -A: memcached stays up
            assert b"ERROR" in sock.recv(64)
        server.executor.process.send_signal(signal.SIGINT)  # memcached exits 0 on SIGINT
        server.executor.process.wait(10)
        (line,) = [d for d in deaths() if f"pid {server.pid} " in d]
        assert "exit status 0" in line
        forget(server.pid)  # a drill: not a death to report later


def test_a_server_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match=r"exit status 1; output: .*unrecognized option"):
        start_memcached(1, extra_args=["--no-such-option"])


def test_deliberate_kills_and_restarts_are_not_deaths():
    with memcached_cluster(2) as (killed, restarted):
        killed.kill()
        restarted.restart()
        assert not [d for d in deaths() if f"pid {killed.pid} " in d]
        assert restarted.executor.running()
