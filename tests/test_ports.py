"""tests/ports.py: the ports the tests put into configs never repeat within one process, never come from
the kernel's ephemeral range, and the suite's parallel workers draw from disjoint sets."""

import socket

import pytest

from tests import ports


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports, "port_block", lambda: range(41000, 41003))
    monkeypatch.setattr(ports, "_bindable", lambda port: True)
    assert sorted(ports.free_port() for _ in range(3)) == [41000, 41001, 41002]
    with pytest.raises(RuntimeError, match="no free port left"):
        ports.free_port()


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        monkeypatch.setattr(ports, "_HANDED_OUT", set())
        monkeypatch.setattr(ports, "port_block", lambda: range(busy, busy + 1))
        with pytest.raises(RuntimeError, match="no free port left"):
            ports.free_port()
    assert ports.free_port() == busy  # closed: free again


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    low, high = ports._ephemeral_range()
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    assert not any(low <= p <= high for p in got)
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))


def test_offsets_are_free_and_handed_out_with_their_port(monkeypatch):
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports, "port_block", lambda: range(41000, 41004))
    monkeypatch.setattr(ports, "_bindable", lambda port: port != 41002)
    assert ports.free_port((0, 2)) == 41001  # 41000 + 2 is taken; 41001 and 41003 are not
    assert ports._HANDED_OUT == {41001, 41003}


def test_each_worker_takes_only_its_own_share_of_the_ports(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    got = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(ports, "_SHARE", ports._worker_share())
        got[worker] = {ports.free_port() for _ in range(20)}
    assert ports._SHARE == (1, 2) and len(got["gw0"]) == len(got["gw1"]) == 20 and not got["gw0"] & got["gw1"]
    blocks = ports.port_block((0, 2)), ports.port_block((1, 2))
    assert all(p in blocks[0] for p in got["gw0"]) and all(p in blocks[1] for p in got["gw1"])
    assert not set(blocks[0]) & set(blocks[1]) and len(blocks[0]) > 1000
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._worker_share() == (0, 1)  # alone: every port


def test_the_ephemeral_range_is_read_from_the_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "_EPHEMERAL_FILE", tmp_path / "range")
    (tmp_path / "range").write_text("1024\t50000\n")  # nothing usable below: the ports above it are taken
    assert ports.port_block((0, 1)) == range(50001, 65536)
    (tmp_path / "range").write_text("40000 60999\n")
    assert ports.port_block((1, 2)) == range(30000, 40000)
    (tmp_path / "range").write_text("1024 65000\n")  # nearly every port is ephemeral: said, not a bad port
    with pytest.raises(RuntimeError, match="fewer than 1000 test ports per worker"):
        ports.port_block((0, 2))
