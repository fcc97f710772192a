"""`eagle3` command line. Each command is a thin shell over the core; exit 2 means bad input.

  app.py      the app, shared helpers, and the phase commands' group (one per phase-table row)
  flow.py     eagle3 run (the pipeline flow)    phases.py   eagle3 <phase>
  observe.py  handoff, gpus, doctor, status     tools.py    validate and the makers/checkers of inputs
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import echo
from . import flow as run, tools, observe  # noqa: F401, I001 - each registers its commands on the app, in this order
from .app import app
from .common import err, exit_code

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt as e:
        err.print("interrupted")
        sys.exit(exit_code(e))
    except Exception as e:  # noqa: BLE001 - the last line: one message and exit 1, never a traceback
        if os.environ.get("EAGLE3_DEBUG"):
            raise
        log = _crash_log()
        err.print(f"error: unexpected {type(e).__name__}: {echo(str(e), 500, quote=False)}\n(details in {log}; "
                  "EAGLE3_DEBUG=1 shows the traceback here)", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exit_code(e))


def _crash_log() -> str:
    """Write the traceback of the exception being handled to a file; its path, or why not."""
    import tempfile
    import time
    import traceback

    text = traceback.format_exc()[-1_000_000:]
    for folder in (Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "eagle3",
                   Path(tempfile.gettempdir())):
        path = folder / f"eagle3-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return str(path)
        except OSError:
            continue
    return "nowhere (no writable state or temp directory)"


if __name__ == "__main__":
    main()
