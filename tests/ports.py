"""Free local ports for test configs and servers: the one implementation every test takes them from."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now and that this process has not handed out before.

    Tests put three of these into one config, and the kernel may give a just-closed ephemeral port
    again at once; two servers of one config on one port is a config error (CI hit it once)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
