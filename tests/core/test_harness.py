import socket

from tests.harness import memcached_cluster


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
