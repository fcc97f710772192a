"""Fixtures of the reliability suite: helper processes ended by PID, and a small real filesystem."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest



def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` on `path`; None on success, else why not (not root, no mount)."""
    if os.geteuid() != 0:
        return "not root"
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if res.returncode == 0 else (res.stderr.strip() or f"mount exited {res.returncode}")


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at tmp_path/disk (a real filesystem that really fills up), or None where
    mounting is not possible (not root); unmounted at teardown."""
    disk = tmp_path / "disk"
    disk.mkdir()
    why = _mount_tmpfs(disk, "2m")
    if why is not None:
        yield None
        return
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)


def fill(disk: Path, leave_bytes: int = 0) -> Path:
    """Fill `disk` to the last page with one file (another job's data), then free `leave_bytes`."""
    filler = disk / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    if leave_bytes:
        os.truncate(filler, max(0, filler.stat().st_size - leave_bytes))
    return filler


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """One PREFECT_HOME for a module's `eagle3 run` processes (each starts Prefect's embedded server;
    a shared home keeps its database migrated after the first). Nothing of it may outlive a test."""
    from tests.flows.flowkit import end_session_leftovers

    home = tmp_path_factory.mktemp("prefect-home")
    yield home
    end_session_leftovers(home)
