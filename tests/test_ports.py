"""tests/ports.py: the ports the tests put into configs never repeat within one process, and the
suite's parallel workers draw from disjoint sets."""

import socket

from tests import ports


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    # The kernel may give the same ephemeral port to consecutive binds; make it do so every time.
    handed = [41001, 41001, 41001, 41002]
    real_socket = socket.socket

    class Repeating(real_socket):
        def getsockname(self):
            return ("127.0.0.1", handed.pop(0))

    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports, "_SHARE", (0, 1))
    monkeypatch.setattr(ports.socket, "socket", Repeating)
    assert [ports.free_port(), ports.free_port()] == [41001, 41002]
    assert handed == []


def test_free_ports_are_distinct_and_bindable():
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))


def test_each_worker_takes_only_its_own_share_of_the_ports(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    got = {}
    for worker in ("gw0", "gw1"):  # the real kernel's choices: each worker gets ports, never the other's
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(ports, "_SHARE", ports._worker_share())
        got[worker] = {ports.free_port() for _ in range(20)}
    assert ports._SHARE == (1, 2) and len(got["gw0"]) == len(got["gw1"]) == 20 and not got["gw0"] & got["gw1"]
    assert all(p // 2 % 2 == 0 for p in got["gw0"]) and all(p // 2 % 2 == 1 for p in got["gw1"])
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._worker_share() == (0, 1)  # alone: every port
