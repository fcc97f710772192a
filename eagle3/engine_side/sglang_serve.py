"""Engine-side (SGLang's interpreter): `python -m sglang.launch_server ARGS`, with the run's API
key from the environment.

SGLang takes its key only as `--api-key`, and every process's argv is readable by every local
user in /proc. Appended to sys.argv here, after exec, it reaches SGLang's parser but never any
process's command line (SGLang's workers get their settings through multiprocessing, not argv).

    EAGLE3_SERVER_API_KEY=KEY python sglang_serve.py --model-path ... --port ...
"""

from __future__ import annotations

import os
import runpy
import sys

KEY_ENV = "EAGLE3_SERVER_API_KEY"


def main() -> None:
    key = os.environ.pop(KEY_ENV, "")  # not inherited by what the server starts
    sys.argv = ["sglang.launch_server", *sys.argv[1:], *(["--api-key", key] if key else [])]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
