"""Stopping the systemd units a config names (e.g. a model server an operator runs as a unit).

Only units listed in `handoff.systemd_units` are touched: naming a unit there declares it the
pipeline's. `systemctl stop` blocks until the unit's own stop logic (KillMode, TimeoutStopSec)
has finished; the unit's state is then read back, since a stop can return 0 on a unit that
failed to stop.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from ..errors import HandoffError

STOPPED_STATES = {"inactive", "failed", "unknown"}


class UnitsNotStopped(HandoffError):
    """Some units did not stop; `records` has one record per unit, as stop_units returns them."""

    def __init__(self, message: str, records: list[dict]):
        super().__init__(message)
        self.records = records


def stop_units(units: list[str], timeout_s: float, systemctl: str | None = None) -> list[dict]:
    """Stop each unit; returns one record per unit. Raises HandoffError with every failure."""
    if not units:
        return []
    exe = systemctl or shutil.which("systemctl")
    if exe is None:
        raise HandoffError(f"handoff.systemd_units lists {units}, but systemctl is not installed on this host; "
                           "remove them from the config or run the pipeline on the host that runs those units")
    records, failures = [], []
    for unit in units:
        t0 = time.monotonic()
        rec = {"unit": unit, "seconds": 0.0, "state": "", "ok": False, "detail": ""}
        try:
            stop = subprocess.run([exe, "stop", unit], capture_output=True, text=True, timeout=timeout_s)
            state = subprocess.run([exe, "is-active", unit], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            rec["detail"] = f"systemctl stop {unit} did not return within {timeout_s:.0f} s"
        else:
            rec["state"] = state.stdout.strip() or "?"
            if stop.returncode != 0:
                rec["detail"] = f"systemctl stop {unit} failed (exit {stop.returncode}): {stop.stderr.strip()}"
            elif rec["state"] not in STOPPED_STATES:
                rec["detail"] = f"{unit} is still '{rec['state']}' after systemctl stop"
            else:
                rec["ok"] = True
        rec["seconds"] = round(time.monotonic() - t0, 3)
        records.append(rec)
        if not rec["ok"]:
            failures.append(rec["detail"])
    if failures:
        raise UnitsNotStopped("could not stop systemd units: " + "; ".join(failures), records)
    return records
