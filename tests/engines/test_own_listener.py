"""Readiness counts only a listener that our server's process group holds, not a stranger on the port."""

from __future__ import annotations

import os
import socket

from eagle3.engines.serving import OwnListener


def test_listener_is_traced_to_its_process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert OwnListener(port, os.getpgid(0)).ready()          # held by this test's group
        assert not OwnListener(port, os.getpgid(0) + 1_000_000).ready()  # any other group: a stranger
    assert not OwnListener(port, os.getpgid(0)).ready()          # closed: nobody listens
