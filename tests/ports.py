"""Free local ports for test configs and servers: the one implementation every test takes them from."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()
_FLOOR = 20000  # above the tiny config's own ports (18601-18603, and 100 above them on a fan-out node)
_EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _worker_share() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker (`make test` runs the suite on two), (0, 1)
    alone. The processes a test starts inherit the worker's variables, and with them its share."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in _EPHEMERAL_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_block(share: tuple[int, int] | None = None) -> range:
    """This worker's block of the ports outside the kernel's ephemeral range.

    Why not bind(port 0): that hands out ephemeral ports, where every process's outgoing connection and
    every port-0 bind lands too (a vLLM engine core's own sockets took one between the hand-out and the
    server's start, CI-like run of 2026-12-03). A test puts its ports into a config long before a server
    binds them, so they must come from where nobody else draws."""
    index, count = share or _SHARE
    low, high = _ephemeral_range()
    below, above = (_FLOOR, low), (high + 1, 65536)
    start, stop = max(below, above, key=lambda r: r[1] - r[0])
    span = (stop - start) // count
    if span < 1000:
        raise RuntimeError(f"{_EPHEMERAL_FILE} is {low}-{high}: fewer than 1000 test ports per worker outside it "
                           f"({start}-{stop - 1} for {count} workers); narrow it or run with TEST_WORKERS=1")
    return range(start + index * span, start + (index + 1) * span)


_SHARE = _worker_share()
_RANDOM = random.Random()  # seeded from the OS: two processes of one worker start at different points


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: TIME_WAIT does not count
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(offsets: tuple[int, ...] = (0,)) -> int:
    """A port P nothing listens on now, that this process has not handed out before, and that no other
    worker of the suite can hand out; with `offsets`, P + each offset is all of that too (a fan-out node
    adds its offset to every server port), and all of them count as handed out.

    Tests put three of these into one config; two servers of one config on one port is a config error."""
    block = port_block()
    top = block.stop - max(offsets)
    first = _RANDOM.randrange(block.start, top)
    for port in (*range(first, top), *range(block.start, first)):
        wanted = [port + o for o in offsets]
        if not _HANDED_OUT.intersection(wanted) and all(map(_bindable, wanted)):
            _HANDED_OUT.update(wanted)
            return port
    raise RuntimeError(f"no free port left in {block} (this worker's share of the test ports)")
