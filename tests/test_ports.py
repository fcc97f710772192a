"""tests/ports.py: the ports the tests put into configs never repeat within one process."""

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
    monkeypatch.setattr(ports.socket, "socket", Repeating)
    assert [ports.free_port(), ports.free_port()] == [41001, 41002]
    assert handed == []


def test_free_ports_are_distinct_and_bindable():
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))
