"""Free local ports for test configs and servers: the one implementation every test takes them from."""

from __future__ import annotations

import os
import socket

_HANDED_OUT: set[int] = set()


def _worker_share() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker (`make test` runs the suite on several), (0, 1) alone.
    The processes a test starts inherit the worker's variables, and with them its share."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


_SHARE = _worker_share()


def free_port() -> int:
    """A port nothing listens on now, that this process has not handed out before, and that no other
    worker of the suite can hand out (each takes the ports whose half is ≡ its index modulo the worker
    count: Linux gives bind(port 0) odd ports first, so the port itself modulo 2 would starve a worker).

    Tests put three of these into one config, and the kernel may give a just-closed ephemeral port
    again at once; two servers of one config on one port is a config error (CI hit it once). Two
    workers drawing at once could be handed the same free port by the kernel in the same way."""
    index, count = _SHARE
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port // 2 % count == index and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
